"""SandboxService over a fake VM factory (``fake_vm.py``: no QEMU, no root), with real durable records: create
records a sandbox before it is reported, a failed restore leaves nothing, delete is idempotent, the lifecycle
moves only between the states it allows (and refuses the rest), and the ways a sandbox enters other than create
(adopt, wake_here) hold it under one id; the sandboxes are the service's alone (a read-only view)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.guest.exec import ExecSpec
from cryobox.agent.sandbox.mapping import adopted_sandbox, stored_wake
from cryobox.agent.sandbox.records import SandboxRecord
from cryobox.agent.sandbox.sandbox import Sandbox, SandboxState
from cryobox.agent.snapshot.store import CaptureInfo
from cryobox.agent.vm import MicroVM, VmState
from cryobox.agentapi import models as am
from cryobox.errors import GuestError, NotFound, PayloadTooLarge, StateError
from cryobox.netpolicy import EgressPolicy
from tests.support.fake_vm import MACHINE, FakeGuest, FakeVm, Rig, make_rig


def vm_state(vm: MicroVM) -> VmState:
    """The VM's state now (read through a call: a state asserted earlier does not narrow it)."""
    return vm.state


def state_of(sandbox: Sandbox) -> SandboxState:
    return sandbox.state


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


async def test_create_restores_from_the_template_and_records_before_it_reports(rig: Rig) -> None:
    sandbox = await rig.service.create("base", metadata={"k": "v"}, env={"A": "1"}, ttl_s=60, sandbox_id="sb-1")
    vm = rig.vm("sb-1")
    assert sandbox.state is SandboxState.RUNNING and vm.state is VmState.RUNNING
    assert vm.restored_from == rig.template.vmstate
    assert vm.fake_guest.ops() == ["resume", "set_clock"]  # rejoined: clock, entropy, identity
    assert vm.fake_guest.calls[0][1]["instance_id"] == sandbox.instance_id != ""
    assert dict(rig.service.sandboxes) == {"sb-1": sandbox}
    [record] = rig.records.load_all()
    assert (record.id, record.state, record.cpus, record.memory_mib) == ("sb-1", "running", 2, 512)
    assert (record.metadata, record.env, record.ttl_s, record.created_at) == ({"k": "v"}, {"A": "1"}, 60, 1000.0)
    assert record.vm is not None and record.vm.vm_id == vm.vm_id
    assert rig.steps.steps == [
        ("create.spawned", {}),
        ("create.restored", {}),
        ("create.recorded", {"sb-1": "running"}),
    ]


async def test_a_warm_pool_vm_becomes_the_instance_it_warmed_as_and_keeps_its_names_and_identity(rig: Rig) -> None:
    """A pool VM rejoined as an instance while it warmed (in its slot, after it was cloned): the sandbox it becomes
    is that instance, and its create's rejoin says so, so the guest keeps what it did then. A VM spawned for the
    create (the pool was empty) rejoins from scratch as a new instance."""
    warm = rig.factory._make(MACHINE, VmState.PAUSED)
    warm.rejoined_as = "warmed-instance-1"
    rig.service.pools["base"]._ready.append(warm)
    pooled = await rig.service.create("base", sandbox_id="sb-pooled")
    [(op, args), *_] = warm.fake_guest.calls
    assert (op, args["instance_id"], args.get("rejoined")) == ("resume", "warmed-instance-1", True)
    assert pooled.instance_id == "warmed-instance-1" and warm.rejoined_as is None  # not offered again
    assert pooled.vm is warm and warm.restored_from is None  # continued, not loaded
    spawned = await rig.service.create("base", sandbox_id="sb-spawned")
    [(op, args), *_] = rig.vm("sb-spawned").fake_guest.calls
    assert op == "resume" and "rejoined" not in args
    assert args["instance_id"] == spawned.instance_id not in ("", "warmed-instance-1")


async def test_the_record_is_written_while_the_guest_rejoins(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The durable record is not on the create's critical path after the guest's rejoin (it takes ~2 ms of
    fsyncs): the guest's ``resume`` is answered only once the record exists, which would never happen if the
    record waited for it."""
    answer = FakeGuest.call
    recorded_at_resume: list[dict[str, str]] = []

    async def call(guest: FakeGuest, op: str, args: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        if op == "resume":
            deadline = time.monotonic() + 2.0
            while not rig.recorded() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            recorded_at_resume.append(rig.recorded())
        return await answer(guest, op, args, **kw)

    monkeypatch.setattr(FakeGuest, "call", call)
    sandbox = await rig.service.create("base", sandbox_id="sb-1")

    assert recorded_at_resume == [{"sb-1": "running"}]
    assert sandbox.state is SandboxState.RUNNING and sandbox.boot_ms > 0
    [record] = rig.records.load_all()
    assert record.boot_ms > 0 and record.vm is not None


async def test_create_refuses_an_id_in_use_without_spawning(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1")
    with pytest.raises(StateError, match="already exists"):
        await rig.service.create("base", sandbox_id="sb-1")
    assert len(rig.factory.made) == 1 and list(rig.service.sandboxes) == ["sb-1"]
    with pytest.raises(NotFound):
        await rig.service.create("nope")


async def test_a_failed_restore_leaves_nothing(rig: Rig) -> None:
    rig.factory.rejoin_error = "clock went backwards"
    with pytest.raises(GuestError, match="clock went backwards"):
        await rig.service.create("base", sandbox_id="sb-1")
    [vm] = rig.factory.made
    assert rig.factory.destroyed == [vm.vm_id] and vm.state is VmState.KILLED
    assert dict(rig.service.sandboxes) == {} and rig.recorded() == {} and rig.service.restoring == 0


async def test_delete_kills_forgets_and_is_idempotent(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1", workspace_id="ws-a")
    await rig.service.create("base", sandbox_id="sb-2", workspace_id="ws-a")
    vm = rig.vm("sb-1")
    with pytest.raises(NotFound):
        await rig.service.delete("sb-1", workspace_id="ws-b")  # another workspace's: not found, kept
    assert "sb-1" in rig.service.sandboxes
    async with rig.service.get("sb-1").lock:  # a lifecycle change in progress: both deletes wait for it
        deletes = [asyncio.create_task(rig.service.delete("sb-1", "ws-a")) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert vm.state is VmState.RUNNING and not any(d.done() for d in deletes)
    await asyncio.gather(*deletes)  # the second finds it gone and returns
    assert rig.factory.destroyed == [vm.vm_id] and vm_state(vm) is VmState.KILLED
    assert list(rig.service.sandboxes) == ["sb-2"] and rig.recorded() == {"sb-2": "running"}
    with pytest.raises(NotFound):
        await rig.service.delete("sb-1")
    assert rig.steps.names().count("delete.killed") == 1


async def test_pause_and_resume_move_between_running_and_paused(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1")
    vm = rig.vm("sb-1")
    paused = await rig.service.pause("sb-1")
    assert paused.state is SandboxState.PAUSED and vm.state is VmState.PAUSED and rig.recorded() == {"sb-1": "paused"}
    assert (await rig.service.pause("sb-1")).state is SandboxState.PAUSED  # idempotent
    with pytest.raises(StateError):
        await rig.service.exec("sb-1", ExecSpec(cmd="true"))  # a paused sandbox answers nothing
    rig.clock.now = 2000.0
    resumed = await rig.service.resume("sb-1")
    assert resumed.state is SandboxState.RUNNING and vm_state(vm) is VmState.RUNNING
    assert rig.recorded() == {"sb-1": "running"} and resumed.last_active == 2000.0
    assert vm.fake_guest.ops()[-2:] == ["resume", "set_clock"]  # its clock stepped again
    assert (await rig.service.resume("sb-1")).state is SandboxState.RUNNING  # a running one stays as it is


async def test_a_lifecycle_change_is_durable_and_counts_as_activity(rig: Rig) -> None:
    """A restarted agent adopts the sandbox from its record: a TTL or persistence change must be in it."""
    await rig.service.create("base", sandbox_id="sb-1", ttl_s=60)
    rig.clock.now = 1500.0
    changed = await rig.service.set_lifecycle("sb-1", ttl_s=None, persistent=True)
    assert (changed.ttl_s, changed.persistent, changed.last_active) == (None, True, 1500.0)
    [record] = rig.records.load_all()
    assert (record.ttl_s, record.persistent) == (None, True)
    await rig.service.set_lifecycle("sb-1", ttl_s=300)  # persistence left as it is
    [record] = rig.records.load_all()
    assert (record.ttl_s, record.persistent) == (300, True)
    await rig.service.set_lifecycle("sb-1", persistent=False)  # the TTL left as it is
    [record] = rig.records.load_all()
    assert (record.ttl_s, record.persistent) == (300, False)
    with pytest.raises(NotFound):
        await rig.service.set_lifecycle("sb-gone", ttl_s=1)


async def test_a_request_in_flight_keeps_the_sandbox_from_expiring(rig: Rig) -> None:
    sandbox = await rig.service.create("base", sandbox_id="sb-1", ttl_s=10)
    rig.clock.now = 2000.0
    async with rig.service.busy("sb-1") as busy:
        assert busy is sandbox and sandbox.in_flight == 1
        assert not sandbox.expired(5000.0) and sandbox.idle_s(5000.0) == 0.0
    assert sandbox.in_flight == 0 and sandbox.last_active == 2000.0 and sandbox.expired(2010.0)
    rig.clock.now = 2100.0
    assert rig.service.touch("sb-1").last_active == 2100.0
    with pytest.raises(NotFound, match="was deleted"):  # the guest failing because the sandbox went away
        async with rig.service.busy("sb-1"):
            await rig.service.delete("sb-1")
            raise GuestError("connection reset")
    assert sandbox.in_flight == 0


async def test_a_hibernated_sandboxs_ttl_does_not_run_and_a_wake_restarts_it(rig: Rig) -> None:
    sandbox = await rig.service.create("base", sandbox_id="sb-1", ttl_s=10)
    rig.clock.now = 2000.0
    await rig.service.hibernate("sb-1")
    assert sandbox.expires_at is None and not sandbox.expired(10**9)  # the paused retention bounds it instead
    rig.clock.now = 9000.0
    await rig.service.resume("sb-1")
    assert sandbox.expires_at == 9010.0 and not sandbox.expired(9009.0) and sandbox.expired(9010.0)


async def test_hibernate_records_before_killing_and_any_request_wakes_it(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1", egress=EgressPolicy(allow=["10.0.0.0/8"]))
    first = rig.vm("sb-1")
    sandbox = await rig.service.hibernate("sb-1")
    image = sandbox.hibernation
    assert sandbox.state is SandboxState.HIBERNATED and image is not None and image.path.is_dir()
    assert first.state is VmState.KILLED and rig.factory.destroyed == [first.vm_id]
    [record] = rig.records.load_all()
    assert record.state == "hibernated" and record.hibernation == str(image.path) and record.vm is None
    steps = dict(rig.steps.steps)
    assert steps["hibernate.captured"] == {"sb-1": "running"} and steps["hibernate.recorded"] == {"sb-1": "hibernated"}
    assert await rig.service.hibernate("sb-1") is sandbox and rig.hibernation.ids() == [image.id]  # idempotent
    with pytest.raises(StateError):
        await rig.service.pause("sb-1")  # only a running sandbox pauses

    result = await rig.service.exec("sb-1", ExecSpec(cmd="true"))  # a request wakes it
    second = rig.vm("sb-1")
    assert result.exit_code == 0 and second is not first and second.state is VmState.RUNNING
    assert second.restored_from == image.vmstate and rig.factory.egress[second.vm_id] == EgressPolicy(
        allow=["10.0.0.0/8"]
    )
    assert state_of(sandbox) is SandboxState.RUNNING and (sandbox.hibernation, sandbox.mapped_image) == (None, image.id)
    assert rig.recorded() == {"sb-1": "running"} and rig.hibernation.ids() == []  # recorded, then the image went
    assert rig.steps.names()[-2:] == ["wake.spawned", "wake.restored"]


async def test_a_wake_waits_in_the_restore_gate_given_once(rig: Rig) -> None:
    entered: list[str] = []

    @contextlib.asynccontextmanager
    async def gate() -> AsyncIterator[None]:
        entered.append("slot")
        yield

    rig.service.set_restore_gate(gate)
    rig.service.set_restore_gate(gate)  # the same gate again: harmless
    with pytest.raises(RuntimeError, match="set already"):
        rig.service.set_restore_gate(contextlib.nullcontext)
    await rig.service.create("base", sandbox_id="sb-1")
    assert entered == []  # a create's slot is its caller's (the host agent's admission)
    await rig.service.hibernate("sb-1")
    await rig.service.wake("sb-1")
    assert entered == ["slot"] and rig.service.get("sb-1").state is SandboxState.RUNNING


async def test_a_failed_wake_stays_hibernated_with_its_image(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1")
    sandbox = await rig.service.hibernate("sb-1")
    image = sandbox.hibernation
    assert image is not None
    rig.factory.rejoin_error = "no entropy"
    with pytest.raises(GuestError):
        await rig.service.wake("sb-1")
    woken = rig.factory.made[-1]
    assert woken.state is VmState.KILLED and rig.factory.destroyed[-1] == woken.vm_id
    assert sandbox.state is SandboxState.HIBERNATED and sandbox.hibernation == image and sandbox.mapped_image is None
    assert rig.recorded() == {"sb-1": "hibernated"} and rig.hibernation.ids() == [image.id]
    rig.factory.rejoin_error = ""
    assert (await rig.service.wake("sb-1")).state is SandboxState.RUNNING  # the image still wakes


async def test_requests_reach_the_guest_with_the_sandboxs_env(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1", env={"A": "1", "B": "2"})
    result = await rig.service.exec("sb-1", ExecSpec(cmd="env", env={"B": "3"}))
    assert json.loads(result.stdout) == {"cmd": "env", "env": {"A": "1", "B": "3"}}
    assert (await rig.service.write_file("sb-1", "/f", b"data"))["bytes"] == 4
    assert await rig.service.read_file("sb-1", "/f") == b"data"
    with pytest.raises(PayloadTooLarge):
        await rig.service.write_file("sb-1", "/big", bytes((64 << 20) + 1))
    with pytest.raises(NotFound):
        await rig.service.exec("sb-1", ExecSpec(cmd="true"), workspace_id="other")


def _record(sandbox_id: str, state: str, **fields: object) -> SandboxRecord:
    base: dict[str, object] = {"template": "base", "cpus": 2, "memory_mib": 512, "created_at": 5.0}
    return SandboxRecord(id=sandbox_id, state=state, **{**base, **fields})  # type: ignore[arg-type]


async def test_adopt_holds_what_an_earlier_agent_left(rig: Rig) -> None:
    vm = rig.factory._make(MACHINE, VmState.RUNNING)
    read = _record("sb-live", "running", ttl_s=30)
    live = adopted_sandbox(read, vm, rig.clock(), state=SandboxState.RUNNING)
    rig.service.adopt(live)
    assert rig.service.get("sb-live") is live and live.adopted and rig.recorded() == {}  # held, not written
    await rig.service.persist(live, read=read)  # the adoption settled: its record differs from what was read
    assert rig.recorded() == {"sb-live": "running"}
    rig.records.remove("sb-live")
    await rig.service.persist(live, read=rig.service.record_of(live))  # the same record: not written again
    assert rig.recorded() == {}
    await rig.service.persist(live)
    assert rig.recorded() == {"sb-live": "running"}

    image = await rig.hibernation.begin(rig.factory._make(MACHINE, VmState.RUNNING), "sb-hib.h1", _info("sb-hib"))
    placeholder = rig.factory.placeholder("sb-hib", image.machine)
    record = _record("sb-hib", "hibernated", mapped_image="old")
    hib = adopted_sandbox(record, placeholder, 0.0, state=SandboxState.HIBERNATED, hibernation=image)
    rig.service.adopt(hib)
    assert hib.mapped_image is None and rig.recorded() == {"sb-live": "running"}  # its record stays as read
    with pytest.raises(StateError, match="already exists"):
        rig.service.adopt(adopted_sandbox(_record("sb-live", "paused"), vm, 0.0, state=SandboxState.PAUSED))
    assert rig.service.get("sb-live") is live and rig.recorded() == {"sb-live": "running"}
    assert (await rig.service.wake("sb-hib")).state is SandboxState.RUNNING  # an adopted hibernation wakes
    assert rig.recorded() == {"sb-live": "running", "sb-hib": "running"}


def _info(sandbox_id: str) -> CaptureInfo:
    return CaptureInfo("base", sandbox_id, "ws-a")


def _wake_spec(sandbox_id: str) -> am.WakeSpec:
    return am.WakeSpec(
        sandbox_id=sandbox_id,
        template="base",
        workspace_id="ws-a",
        created_at=3.0,
        instance_id="inst-1",
        metadata={"m": "1"},
        env={"E": "2"},
        ttl_s=90,
        egress=EgressPolicy(allow=["10.1.0.0/16"]),
    )


async def _imported(rig: Rig, sandbox_id: str) -> Sandbox:
    """A sandbox hibernated elsewhere, its image as an import leaves it in this host's hibernation store."""
    elsewhere = rig.factory._make(MACHINE, VmState.RUNNING, prefix="elsewhere")
    image = await rig.hibernation.begin(elsewhere, f"{sandbox_id}.h9", _info(sandbox_id))
    placeholder = rig.factory.placeholder(sandbox_id, image.machine)
    return stored_wake(_wake_spec(sandbox_id), image, placeholder, rig.clock())


async def test_wake_here_records_then_wakes_a_stored_hibernation(rig: Rig) -> None:
    sandbox = await _imported(rig, "sb-9")
    assert sandbox.state is SandboxState.HIBERNATED and sandbox.instance_id == "inst-1"
    woken = await rig.service.wake_here(sandbox, started=time.monotonic() - 2.0)  # the import took 2 s
    assert woken is rig.service.get("sb-9") and woken.state is SandboxState.RUNNING and woken.boot_ms >= 2000
    assert dict(rig.steps.steps)["wake.spawned"] == {"sb-9": "hibernated"}  # recorded here before it wakes
    assert rig.vm("sb-9").fake_guest.calls[0][1]["instance_id"] == "inst-1"  # the identity it had elsewhere
    assert rig.factory.egress[rig.vm("sb-9").vm_id] == EgressPolicy(allow=["10.1.0.0/16"])
    [record] = rig.records.load_all()
    assert (record.state, record.workspace_id, record.env, record.ttl_s) == ("running", "ws-a", {"E": "2"}, 90)
    assert rig.hibernation.ids() == []


async def test_a_failed_wake_here_leaves_nothing_here(rig: Rig) -> None:
    sandbox = await _imported(rig, "sb-9")
    rig.factory.rejoin_error = "hook failed"
    with pytest.raises(GuestError):
        await rig.service.wake_here(sandbox, started=0.0)
    assert dict(rig.service.sandboxes) == {} and rig.recorded() == {} and rig.hibernation.ids() == []


async def test_wake_here_refuses_an_id_held_and_drops_the_import(rig: Rig) -> None:
    held = await rig.service.create("base", sandbox_id="sb-9")
    with pytest.raises(StateError, match="already exists"):
        await rig.service.wake_here(await _imported(rig, "sb-9"), started=0.0)
    assert rig.service.get("sb-9") is held and rig.recorded() == {"sb-9": "running"} and rig.hibernation.ids() == []


async def test_the_sandboxes_are_a_read_only_view(rig: Rig) -> None:
    sandbox = await rig.service.create("base", sandbox_id="sb-1")
    view = rig.service.sandboxes
    with pytest.raises(TypeError):
        view["sb-2"] = sandbox  # type: ignore[index]
    await rig.service.delete("sb-1")
    assert "sb-1" not in view and rig.service.held() == []


async def test_close_keep_detaches_and_keeps_records_else_kills_and_forgets(tmp_path: Path) -> None:
    keep = make_rig(tmp_path / "keep")
    await keep.service.create("base", sandbox_id="sb-1")
    vm = keep.vm("sb-1")
    await keep.service.close(keep=True)
    assert vm.detached and keep.factory.destroyed == [] and keep.recorded() == {"sb-1": "running"}
    assert dict(keep.service.sandboxes) == {}

    kill = make_rig(tmp_path / "kill")
    await kill.service.create("base", sandbox_id="sb-1")
    await kill.service.create("base", sandbox_id="sb-2")
    await kill.service.hibernate("sb-2")
    await kill.service.close()
    assert kill.recorded() == {} and kill.hibernation.ids() == [] and set(kill.factory.destroyed) == {"vm-1", "vm-2"}
    assert all(vm.state is VmState.KILLED for vm in kill.factory.made)


async def test_hibernate_all_hibernates_the_live_ones(rig: Rig) -> None:
    await rig.service.create("base", sandbox_id="sb-1")
    await rig.service.create("base", sandbox_id="sb-2")
    await rig.service.pause("sb-2")
    assert rig.service.running() == 2
    assert await rig.service.hibernate_all() == 0
    assert rig.recorded() == {"sb-1": "hibernated", "sb-2": "hibernated"} and rig.service.running() == 0
    assert isinstance(rig.service.get("sb-1").vm, FakeVm)
