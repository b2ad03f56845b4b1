"""Snapshots and forks of sandboxes with volumes, over fake VMs (``fake_vm.py``): the guest releases its volumes
for the capture (the captured guest has none mounted) and mounts them again after it; a volume in use is a 409
``volume_busy`` that leaves the sandbox as it was and no snapshot; a paused sandbox is refused; a tree's volume
clones are made while the volumes are released, each child restores with its own, and a child that fails loses
its clones; a cold fork child gets its volumes after its boot, its clones made inside the parent's pause."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryobox.agent.vm import VmState
from cryobox.agent.vm.volumes import VolumeAttach
from cryobox.agent.volumes.clones import VolumeClone
from cryobox.errors import InvalidArgument, StateError
from tests.support.fake_vm import Rig, blank_image, make_rig, with_volume_slots


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return with_volume_slots(make_rig(tmp_path), tmp_path)


def _image(tmp_path: Path, name: str, content: bytes = b"") -> Path:
    return blank_image(tmp_path, name, content)


async def _parent(rig: Rig, tmp_path: Path) -> tuple[Path, Path]:
    data, ref = _image(tmp_path, "data.ext4", b"parent data"), _image(tmp_path, "ref.ext4")
    wanted = [
        VolumeAttach(data, mount_path="/mnt/data", name="data"),
        VolumeAttach(ref, read_only=True, mount_path="/mnt/ref", name="ref"),
    ]
    await rig.service.create("vols", sandbox_id="sb-p", volumes=wanted)
    assert rig.vm("sb-p").fake_guest.mounted == {"/mnt/data", "/mnt/ref"}
    return data, ref


async def test_a_snapshot_captures_a_guest_without_its_volumes_mounted_then_mounts_them_again(
    rig: Rig, tmp_path: Path
) -> None:
    await _parent(rig, tmp_path)
    guest = rig.vm("sb-p").fake_guest
    seen: list[set[str]] = []

    async def released() -> None:
        seen.append(set(guest.mounted))

    image = await rig.forking.snapshot("sb-p", released=released)
    assert rig.snapshots.mounted_at_capture[image.id] == set() and seen == [set()]
    assert guest.ops()[-2:] == ["volumes_release", "volumes_mount"]
    release, mount = guest.calls[-2][1], guest.calls[-1][1]
    assert [v["path"] for v in release["volumes"]] == ["/mnt/data", "/mnt/ref"] and release["disks"] == []
    assert [v["path"] for v in mount["volumes"]] == ["/mnt/data", "/mnt/ref"]
    assert guest.mounted == {"/mnt/data", "/mnt/ref"} and rig.snapshots.ids() == [image.id]


async def test_a_volume_in_use_refuses_the_snapshot_and_changes_nothing(rig: Rig, tmp_path: Path) -> None:
    await _parent(rig, tmp_path)
    guest = rig.vm("sb-p").fake_guest
    guest.busy.add("/mnt/ref")
    with pytest.raises(StateError) as err:
        await rig.forking.snapshot("sb-p")
    assert err.value.state == "volume_busy" and err.value.http_status == 409
    assert "/mnt/ref" in err.value.message and "working directory" in err.value.message
    assert err.value.details["path"] == "/mnt/ref"
    assert rig.snapshots.ids() == [] and guest.mounted == {"/mnt/data", "/mnt/ref"}
    assert guest.ops()[-1] == "volumes_release"  # nothing to mount again: the guest kept them


async def test_a_failed_mount_after_the_capture_discards_the_snapshot(rig: Rig, tmp_path: Path) -> None:
    await _parent(rig, tmp_path)
    rig.vm("sb-p").unmountable.add("/mnt/data")
    with pytest.raises(StateError, match="could not mount"):
        await rig.forking.snapshot("sb-p")
    assert rig.snapshots.ids() == []


async def test_a_paused_sandbox_with_volumes_is_refused(rig: Rig, tmp_path: Path) -> None:
    await _parent(rig, tmp_path)
    await rig.service.pause("sb-p")
    with pytest.raises(StateError, match="resume it") as err:
        await rig.forking.snapshot("sb-p")
    assert err.value.state == "paused" and rig.snapshots.ids() == []
    assert rig.vm("sb-p").state is VmState.PAUSED


async def test_tree_children_get_their_own_clones_and_a_failed_child_loses_them(rig: Rig, tmp_path: Path) -> None:
    data, ref = await _parent(rig, tmp_path)
    guest = rig.vm("sb-p").fake_guest
    clones = {c: [VolumeClone(data, tmp_path / f"clone-{c}.ext4")] for c in ("sb-a", "sb-b")}
    volumes = {
        c: [
            VolumeAttach(tmp_path / f"clone-{c}.ext4", mount_path="/mnt/data", name=f"data-{c}"),
            VolumeAttach(ref, read_only=True, mount_path="/mnt/ref", name="ref"),
        ]
        for c in clones
    }
    tree = await rig.forking.fork_tree("sb-p", child_ids=["sb-a", "sb-b"], volumes=volumes, clones=clones)
    assert [c.id for c in tree.children] == ["sb-a", "sb-b"] and tree.errors == []
    assert rig.snapshots.mounted_at_capture[tree.snapshot.id] == set() and guest.mounted == {"/mnt/data", "/mnt/ref"}
    for child in tree.children:
        clone = tmp_path / f"clone-{child.id}.ext4"
        assert clone.read_bytes() == data.read_bytes() and clone.stat().st_size == 1 << 20
        assert [(v.path, v.read_only) for v in child.volumes] == [(str(clone), False), (str(ref), True)]
        assert rig.vm(child.id).fake_guest.mounted == {"/mnt/data", "/mnt/ref"}

    rig.factory.rejoin_error = "resume hook failed"  # every child of the next tree fails
    failing = {"sb-c": [VolumeClone(data, tmp_path / "clone-sb-c.ext4")]}
    attach = {"sb-c": [VolumeAttach(tmp_path / "clone-sb-c.ext4", mount_path="/mnt/data")]}
    tree = await rig.forking.fork_tree("sb-p", child_ids=["sb-c"], volumes=attach, clones=failing)
    assert tree.children == [] and len(tree.errors) == 1
    assert not (tmp_path / "clone-sb-c.ext4").exists()


async def test_a_busy_parent_makes_no_tree_and_no_clone(rig: Rig, tmp_path: Path) -> None:
    data, _ = await _parent(rig, tmp_path)
    rig.vm("sb-p").fake_guest.busy.add("/mnt/data")
    clones = {"sb-a": [VolumeClone(data, tmp_path / "clone-sb-a.ext4")]}
    with pytest.raises(StateError, match="in use"):
        await rig.forking.fork_tree("sb-p", child_ids=["sb-a"], clones=clones)
    assert not (tmp_path / "clone-sb-a.ext4").exists() and rig.snapshots.ids() == []
    assert list(rig.service.sandboxes) == ["sb-p"]


async def test_a_cold_fork_child_gets_its_volumes_after_its_boot(rig: Rig, tmp_path: Path) -> None:
    data, ref = await _parent(rig, tmp_path)
    clone = tmp_path / "clone-sb-c.ext4"
    child = await rig.forking.fork(
        "sb-p",
        child_id="sb-c",
        volumes=[VolumeAttach(clone, mount_path="/mnt/data"), VolumeAttach(ref, read_only=True, mount_path="/r")],
        clones=[VolumeClone(data, clone)],
    )
    vm = rig.vm("sb-c")
    assert clone.read_bytes() == data.read_bytes() and [v.path for v in child.volumes] == [str(clone), str(ref)]
    assert vm.qmp_commands().count("qom-set") == 4  # attached (only a paused VM takes volumes), then continued
    assert vm.fake_guest.mounted == {"/mnt/data", "/r"} and vm.state is VmState.RUNNING
    assert rig.vm("sb-p").fake_guest.ops().count("volumes_release") == 0  # a fork copies; the parent only pauses

    rig.factory.rejoin_error = "resume hook failed"
    again = tmp_path / "clone-sb-d.ext4"
    with pytest.raises(Exception, match="resume hook failed"):
        await rig.forking.fork(
            "sb-p", child_id="sb-d", volumes=[VolumeAttach(again, mount_path="/d")], clones=[VolumeClone(data, again)]
        )
    assert not again.exists() and "sb-d" not in rig.service.sandboxes


async def test_too_many_volumes_for_a_fork_child_copy_nothing(rig: Rig, tmp_path: Path) -> None:
    data, _ = await _parent(rig, tmp_path)
    clone = tmp_path / "clone.ext4"
    made = len(rig.factory.made)
    with pytest.raises(InvalidArgument, match="at most 2 read-write"):
        await rig.forking.fork("sb-p", volumes=[VolumeAttach(data)] * 3, clones=[VolumeClone(data, clone)])
    assert not clone.exists() and len(rig.factory.made) == made and rig.vm("sb-p").state is VmState.RUNNING
