"""Attaching volumes to a VM whose vCPUs are stopped: the QMP sequence (an fd, a raw node with writeback cache and
image locking, the doorbell rung with the volume's size, the slot re-pointed), slot assignment and its limits,
the errors a caller can cause, and detaching (a pool VM's warm-up) and settling (a delete)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.vm import Accel, MachineConfig, VmState
from cryobox.agent.vm.volumes import (
    DOORBELL,
    AttachedVolume,
    VolumeAttach,
    assign_slots,
    attach_fd,
    attach_volumes,
    check_mount_path,
    detach_volumes,
    settle_volumes,
)
from cryobox.errors import InvalidArgument, NotFound, StateError
from tests.support.fake_vm import FakeVm

MACHINE = MachineConfig(512, 1, Accel.TCG, Path("/k"), Path("/i"), 1, True, rw_volume_slots=2, ro_volume_slots=1)
MIB = 1 << 20


def _image(tmp_path: Path, name: str, size: int = 4 * MIB) -> Path:
    path = tmp_path / name
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def _vm(tmp_path: Path, state: VmState = VmState.PAUSED, machine: MachineConfig = MACHINE) -> FakeVm:
    return FakeVm("vm-1", machine, tmp_path / "run", state, "")


def _calls(vm: FakeVm, command: str) -> list[dict[str, Any]]:
    return [args for name, args in vm.qmp_log if name == command]


async def test_a_volume_joins_through_the_doorbell(tmp_path: Path) -> None:
    vm = _vm(tmp_path)
    image = _image(tmp_path, "data.ext4")
    (attached,) = await attach_volumes(vm, [VolumeAttach(image, mount_path="/mnt/data", name="data")])
    assert vm.qmp_commands() == [
        "add-fd",  # the doorbell: made once per VM
        "blockdev-add",
        "remove-fd",
        "add-fd",  # the volume
        "blockdev-add",
        "remove-fd",
        "qom-set",
        "block_resize",
        "qom-set",
    ]
    doorbell, volume = _calls(vm, "blockdev-add")
    assert doorbell["node-name"] == DOORBELL
    assert volume["node-name"] == "vol-rw0-volume" and volume["read-only"] is False
    assert volume["cache"] == {"direct": False, "no-flush": False}  # guest flushes reach the image
    (_, add_volume_fd) = _calls(vm, "add-fd")  # the set's id is ours, sent in the same pipeline as the node
    assert volume["file"]["filename"] == f"/dev/fdset/{add_volume_fd['fdset-id']}" and volume["file"]["locking"] == "on"
    assert _calls(vm, "remove-fd")[1] == {"fdset-id": add_volume_fd["fdset-id"]}
    ring, swap = _calls(vm, "qom-set")
    assert ring == {"path": "/machine/peripheral/vol-rw0", "property": "drive", "value": DOORBELL}
    assert swap == {"path": "/machine/peripheral/vol-rw0", "property": "drive", "value": "vol-rw0-volume"}
    assert _calls(vm, "block_resize") == [{"node-name": DOORBELL, "size": 4 * MIB}]  # never the tenant's image
    assert attached == AttachedVolume(
        slot="vol-rw0",
        serial="cbx-vol-rw0",
        device="/dev/vdb",
        path=str(image),
        read_only=False,
        mount_path="/mnt/data",
        size_bytes=4 * MIB,
        name="data",
    )
    assert vm.volumes == (attached,) and vm.volume_doorbell
    assert attached.guest_mount() == {
        "serial": "cbx-vol-rw0",
        "device": "vdb",
        "sectors": 8192,
        "path": "/mnt/data",
        "read_only": False,
    }
    assert AttachedVolume.from_json(attached.to_json()) == attached


async def test_read_only_volumes_take_read_only_slots(tmp_path: Path) -> None:
    vm = _vm(tmp_path, VmState.INCOMING)  # a spawned VM, its state loaded: vCPUs not started yet
    rw, ro = _image(tmp_path, "rw.ext4"), _image(tmp_path, "ro.ext4", 2 * MIB)
    attached = await attach_volumes(vm, [VolumeAttach(ro, read_only=True), VolumeAttach(rw)])
    slots = [(a.slot, a.device, a.read_only) for a in attached]
    assert slots == [("vol-rw0", "/dev/vdb", False), ("vol-ro0", "/dev/vdd", True)]
    ro_node = _calls(vm, "blockdev-add")[-1]
    assert ro_node["read-only"] is True and ro_node["node-name"] == "vol-ro0-volume"
    assert attached[1].guest_mount() is None  # no mount path: the guest only gets the disk
    assert _calls(vm, "add-fd").count({"opaque": DOORBELL}) == 1


async def test_assignment_limits_and_mount_paths(tmp_path: Path) -> None:
    image = _image(tmp_path, "a.ext4")
    with pytest.raises(InvalidArgument, match="at most 2 read-write volumes"):
        assign_slots(MACHINE, [VolumeAttach(image)] * 3)
    with pytest.raises(InvalidArgument, match="at most 1 read-only"):
        assign_slots(MACHINE, [VolumeAttach(image, read_only=True)] * 2)
    with pytest.raises(InvalidArgument, match="same path"):
        assign_slots(MACHINE, [VolumeAttach(image, mount_path="/d"), VolumeAttach(image, mount_path="/d")])
    with pytest.raises(InvalidArgument, match="at most 0"):
        assign_slots(MachineConfig(512, 1, Accel.TCG, Path("/k"), Path("/i"), 1, True), [VolumeAttach(image)])
    assert assign_slots(MACHINE, []) == []


REFUSED = ["relative", "/", "//x", "/a/../b", "/a/", "/proc", "/sys/x", "/dev/vdb", "/run/cryobox/x", "/a\nb"]


@pytest.mark.parametrize("path", REFUSED)
def test_mount_paths_refused(path: str) -> None:
    with pytest.raises(InvalidArgument):
        check_mount_path(path)
    with pytest.raises(InvalidArgument):
        VolumeAttach(Path("/v"), mount_path=path)


def test_mount_paths_accepted() -> None:
    for path in ("/mnt/data", "/home/user/data", "/data", "/runner", "/devices"):
        assert check_mount_path(path) == path


async def test_what_a_caller_can_get_wrong_changes_nothing(tmp_path: Path) -> None:
    vm = _vm(tmp_path)
    with pytest.raises(NotFound, match="gone"):
        await attach_volumes(vm, [VolumeAttach(tmp_path / "missing.ext4", name="gone")])
    odd = _image(tmp_path, "odd.ext4", 4 * MIB + 100)
    with pytest.raises(InvalidArgument, match="sectors"):
        await attach_volumes(vm, [VolumeAttach(odd)])
    (tmp_path / "link.ext4").symlink_to(_image(tmp_path, "target.ext4"))
    with pytest.raises(Exception, match="cannot open"):  # no symlink is followed
        await attach_volumes(vm, [VolumeAttach(tmp_path / "link.ext4")])
    assert "qom-set" not in vm.qmp_commands() and vm.volumes == ()


async def test_an_image_locked_by_another_qemu_is_a_conflict(tmp_path: Path) -> None:
    vm = _vm(tmp_path)
    vm.qmp_errors["qom-set"] = 'Failed to get "write" lock'
    with pytest.raises(StateError, match="attached to another sandbox"):
        await attach_volumes(vm, [VolumeAttach(_image(tmp_path, "busy.ext4"), name="busy")])


async def test_a_running_vm_or_a_second_attach_is_refused(tmp_path: Path) -> None:
    image = _image(tmp_path, "a.ext4")
    with pytest.raises(StateError, match="stopped"):
        await attach_volumes(_vm(tmp_path, VmState.RUNNING), [VolumeAttach(image)])
    vm = _vm(tmp_path)
    await attach_volumes(vm, [VolumeAttach(image)])
    with pytest.raises(StateError, match="already"):
        await attach_volumes(vm, [VolumeAttach(image)])


async def test_no_volume_no_command(tmp_path: Path) -> None:
    vm = _vm(tmp_path)
    assert await attach_volumes(vm, []) == ()
    assert vm.qmp_log == []


async def test_warm_up_attach_and_detach_leave_the_slot_empty(tmp_path: Path) -> None:
    vm = _vm(tmp_path)
    image = _image(tmp_path, "warm.ext4")
    with open(image, "rb") as fh:
        attached = await attach_fd(vm, fh.fileno(), VolumeAttach(image, mount_path="/.w"))
    assert attached.slot == "vol-rw1"  # the last read-write slot
    vm.qmp_log.clear()
    await detach_volumes(vm)
    assert vm.qmp_log == [
        ("qom-set", {"path": "/machine/peripheral/vol-rw1", "property": "drive", "value": DOORBELL}),
        ("block_resize", {"node-name": DOORBELL, "size": 0}),  # the guest reads capacity 0 again
        ("qom-set", {"path": "/machine/peripheral/vol-rw1", "property": "drive", "value": "vol-rw1-empty"}),
        ("blockdev-del", {"node-name": "vol-rw1-volume"}),
    ]
    assert vm.volumes == ()


async def test_settle_freezes_the_mounted_read_write_volumes(tmp_path: Path) -> None:
    vm = _vm(tmp_path, VmState.RUNNING)
    assert await settle_volumes(vm) == {}  # nothing attached: no guest call
    vm.volumes = (
        AttachedVolume("vol-rw0", "cbx-vol-rw0", "/dev/vdb", "/v/a", False, "/mnt/a", MIB),
        AttachedVolume("vol-rw1", "cbx-vol-rw1", "/dev/vdc", "/v/b", False, None, MIB),
        AttachedVolume("vol-ro0", "cbx-vol-ro0", "/dev/vdd", "/v/c", True, "/mnt/c", MIB),
    )
    reply = await settle_volumes(vm)
    assert reply["settled"] == {"/mnt/a": "frozen"}
    assert vm.fake_guest.calls[-1] == ("volumes_settle", {"paths": ["/mnt/a"], "mode": "freeze"})
    vm.state = VmState.PAUSED  # a paused guest cannot answer: the kill goes ahead without it
    calls = len(vm.fake_guest.calls)
    assert await settle_volumes(vm) == {}
    assert len(vm.fake_guest.calls) == calls
