"""Forking over a fake VM factory (``fake_vm.py``): a fork child cold-boots from a copy of its parent's disk
and is held and recorded under a fresh id; a fork_tree restores its children from one snapshot, reports a
child that fails in ``errors`` without failing the tree, and leaves no child when its snapshot cannot be made
durable; every child waits in its own admission slot; a hibernated parent is woken first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cryobox.agent.sandbox.sandbox import SandboxState
from cryobox.agent.vm import VmState
from cryobox.errors import GuestError, InvalidArgument, StateError
from cryobox.netpolicy import EgressPolicy
from tests.support.fake_vm import Rig, make_rig


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


async def test_a_fork_child_boots_from_the_parents_disk_under_a_fresh_id(rig: Rig) -> None:
    parent = await rig.service.create(
        "base", sandbox_id="sb-p", env={"A": "1"}, egress=EgressPolicy(allow=["10.0.0.0/8"]), ttl_s=60
    )
    child = await rig.forking.fork("sb-p", metadata={"role": "child"})
    assert child.id.startswith("sb-") and child.id != parent.id and rig.service.get(child.id) is child
    assert (child.state, child.boot_mode, child.workspace_id) == (SandboxState.RUNNING, "cold", parent.workspace_id)
    assert (child.env, child.egress, child.metadata) == (
        {"A": "1"},
        EgressPolicy(allow=["10.0.0.0/8"]),
        {"role": "child"},
    )
    assert child.ttl_s is None and child.instance_id not in ("", parent.instance_id)
    assert rig.factory.cold_disks == [parent.vm.disk.read_bytes()]  # a copy of the parent's disk
    assert rig.factory.egress[child.vm.vm_id] == EgressPolicy(allow=["10.0.0.0/8"])
    assert rig.vm(child.id).fake_guest.calls[0][1]["instance_id"] == child.instance_id  # rejoined as itself
    assert parent.vm.state is VmState.RUNNING  # paused for the copy only
    assert rig.recorded() == {"sb-p": "running", child.id: "running"}
    [record] = [r for r in rig.records.load_all() if r.id == child.id]
    assert record.boot_mode == "cold" and record.metadata == {"role": "child"}
    assert not list(rig.factory.run_dir.glob(".fork-*"))  # the disk copy is gone
    named = await rig.forking.fork("sb-p", child_id="sb-named")
    assert named.id == "sb-named" and rig.service.get("sb-named") is named


async def test_a_paused_parent_stays_paused_and_a_hibernated_one_is_woken(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-p")
    await rig.service.pause("sb-p")
    await rig.forking.fork("sb-p")
    assert rig.service.get("sb-p").state is SandboxState.PAUSED and rig.vm("sb-p").state is VmState.PAUSED
    await rig.service.resume("sb-p")
    await rig.service.hibernate("sb-p")
    child = await rig.forking.fork("sb-p")
    assert rig.service.get("sb-p").state is SandboxState.RUNNING and child.state is SandboxState.RUNNING


async def test_a_fork_child_that_fails_leaves_nothing(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-p")
    rig.factory.rejoin_error = "resume hook failed"
    with pytest.raises(GuestError):
        await rig.forking.fork("sb-p", child_id="sb-c")
    child_vm = rig.factory.made[-1]
    assert child_vm.state is VmState.KILLED and rig.factory.destroyed == [child_vm.vm_id]
    assert list(rig.service.sandboxes) == ["sb-p"] and rig.recorded() == {"sb-p": "running"}
    assert not list(rig.factory.run_dir.glob(".fork-*")) and rig.forking.children_restoring == 0


async def test_a_fork_child_never_takes_an_id_held(rig: Rig) -> None:
    other = await rig.service.create("base", sandbox_id="sb-other")
    await rig.service.create("base", sandbox_id="sb-p")
    with pytest.raises(StateError, match="already exists"):
        await rig.forking.fork("sb-p", child_id="sb-other")
    assert rig.service.get("sb-other") is other and rig.factory.destroyed == [rig.factory.made[-1].vm_id]
    assert rig.recorded() == {"sb-other": "running", "sb-p": "running"}


async def test_fork_tree_restores_its_children_from_one_snapshot(rig: Rig) -> None:
    parent = await rig.service.create("base", sandbox_id="sb-p", egress=EgressPolicy(allow=["10.0.0.0/8"]))
    tree = await rig.forking.fork_tree("sb-p", count=3, metadata={"m": "1"}, tree_id="tree-1")
    ids = [c.id for c in tree.children]
    assert len(set(ids)) == 3 and parent.id not in ids and tree.errors == []
    assert rig.snapshots.ids() == [tree.snapshot.id] and tree.snapshot.manifest["sandbox_id"] == "sb-p"
    for child in tree.children:
        assert rig.service.get(child.id) is child and child.state is SandboxState.RUNNING
        assert rig.vm(child.id).restored_from == tree.snapshot.vmstate
        assert child.metadata == {"m": "1", "cryobox.tree_id": "tree-1", "cryobox.parent_id": "sb-p"}
        assert child.from_snapshot == tree.snapshot.id and child.egress == EgressPolicy(allow=["10.0.0.0/8"])
    assert rig.recorded() == {"sb-p": "running", **dict.fromkeys(ids, "running")}
    names = rig.steps.names()
    assert names.index("fork_tree.captured") < names.index("fork_tree.children")
    assert names.count("create.recorded") == 4  # the parent and three children


async def test_a_failing_tree_child_is_reported_not_fatal(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-p")
    taken = await rig.service.create("base", sandbox_id="sb-taken")
    tree = await rig.forking.fork_tree("sb-p", child_ids=["sb-a", "sb-taken", "sb-c"], tree_id="tree-1")
    assert [c.id for c in tree.children] == ["sb-a", "sb-c"]
    [(index, message)] = tree.errors
    assert index == 1 and "already exists" in message
    assert rig.service.get("sb-taken") is taken and taken.metadata == {}
    assert set(rig.recorded()) == {"sb-p", "sb-taken", "sb-a", "sb-c"}


async def test_a_tree_whose_snapshot_cannot_be_made_durable_leaves_no_child(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-p")
    rig.snapshots.finish_error = OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        await rig.forking.fork_tree("sb-p", child_ids=["sb-a", "sb-b"])
    assert list(rig.service.sandboxes) == ["sb-p"] and rig.recorded() == {"sb-p": "running"}
    assert rig.snapshots.ids() == [] and len(rig.factory.destroyed) == 2


async def test_fork_tree_bounds_its_count(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-p")
    for count in (0, 17):
        with pytest.raises(InvalidArgument):
            await rig.forking.fork_tree("sb-p", count=count)
    only_snapshot = await rig.forking.fork_tree("sb-p", child_ids=[])
    assert only_snapshot.children == [] and rig.snapshots.ids() == [only_snapshot.snapshot.id]


async def test_every_child_waits_in_its_own_slot(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-p")
    gate = asyncio.Semaphore(1)
    slots: list[int] = []

    @contextlib.asynccontextmanager
    async def slot() -> AsyncIterator[None]:
        async with gate:
            slots.append(rig.forking.children_restoring)
            yield

    tree = await rig.forking.fork_tree("sb-p", count=3, slot=slot)
    child = await rig.forking.fork("sb-p", slot=slot)
    assert len(tree.children) == 3 and child.state is SandboxState.RUNNING
    assert slots == [0, 0, 0, 0] and rig.forking.children_peak == 1 and rig.forking.children_restoring == 0
