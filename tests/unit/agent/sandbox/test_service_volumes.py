"""Volumes through the sandbox service, on fake VMs: attached before the vCPUs run and mounted in the guest's
``resume``; a create without volumes touches no slot; refusals leave nothing; a delete settles them; a hibernated
sandbox wakes with them re-attached (not re-mounted); snapshots and forks: test_forking_volumes.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.sandbox.lifecycle import Lifecycle
from cryobox.agent.sandbox.mapping import adopted_sandbox
from cryobox.agent.sandbox.sandbox import SandboxState
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import VmState
from cryobox.agent.vm.volumes import VolumeAttach
from cryobox.errors import InvalidArgument, StateError
from tests.support.fake_vm import SLOTTED, FakeVm, Rig, blank_image, make_rig, with_volume_slots


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return with_volume_slots(make_rig(tmp_path), tmp_path)


def _image(tmp_path: Path, name: str, content: bytes = b"") -> Path:
    return blank_image(tmp_path, name, content)


def _resume_args(vm: FakeVm) -> list[dict[str, Any]]:
    return [args for op, args in vm.fake_guest.calls if op == "resume"]


async def test_volumes_are_attached_before_the_guest_runs_and_mounted_in_its_resume(rig: Rig, tmp_path: Path) -> None:
    data, ref = _image(tmp_path, "data.ext4"), _image(tmp_path, "ref.ext4")
    wanted = [VolumeAttach(data, mount_path="/mnt/data", name="data"), VolumeAttach(ref, read_only=True)]
    sandbox = await rig.service.create("vols", sandbox_id="sb-1", volumes=wanted)
    vm = rig.vm("sb-1")
    assert vm.restored_from is not None and vm.qmp_commands().count("qom-set") == 4  # 2 rings + 2 swaps
    assert [v.slot for v in sandbox.volumes] == ["vol-rw0", "vol-ro0"] and sandbox.volumes == vm.volumes
    (args,) = _resume_args(vm)
    assert args["volumes"] == [
        {"serial": "cbx-vol-rw0", "device": "vdb", "sectors": 2048, "path": "/mnt/data", "read_only": False}
    ]  # the read-only one has no mount path: the guest just gets the disk
    (record,) = rig.records.load_all()
    assert [v["path"] for v in record.volumes] == [str(data), str(ref)]
    survivor = FakeVm("vm-x", SLOTTED, tmp_path, VmState.RUNNING, "")
    adopted = adopted_sandbox(record, survivor, 5.0, state=SandboxState.RUNNING)
    assert adopted.volumes == sandbox.volumes and adopted.vm.volumes == sandbox.volumes


async def test_a_create_without_volumes_touches_no_slot(rig: Rig) -> None:
    await rig.service.create("vols", sandbox_id="sb-1")
    vm = rig.vm("sb-1")
    assert vm.qmp_log == [] and vm.volumes == ()
    assert "volumes" not in _resume_args(vm)[0]


async def test_refusals_leave_nothing(rig: Rig, tmp_path: Path) -> None:
    data = _image(tmp_path, "data.ext4")
    with pytest.raises(InvalidArgument, match="at most 2 read-write"):
        await rig.service.create("vols", volumes=[VolumeAttach(data)] * 3)
    with pytest.raises(InvalidArgument, match="at most 0"):
        await rig.service.create("base", volumes=[VolumeAttach(data)])  # a template baked without slots
    assert rig.factory.made == []


async def test_a_volume_the_guest_cannot_mount_fails_the_create(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make = rig.factory._make

    def unmountable(*args: Any, **kwargs: Any) -> FakeVm:
        vm = make(*args, **kwargs)
        vm.unmountable = {"/bad"}
        return vm

    monkeypatch.setattr(rig.factory, "_make", unmountable)
    with pytest.raises(StateError, match="could not mount"):
        await rig.service.create("vols", volumes=[VolumeAttach(_image(tmp_path, "d.ext4"), mount_path="/bad")])
    (vm,) = rig.factory.made
    assert rig.service.sandboxes == {} and rig.factory.destroyed == [vm.vm_id] and rig.records.load_all() == []


async def test_delete_settles_the_volumes_before_the_kill(rig: Rig, tmp_path: Path) -> None:
    data = _image(tmp_path, "data.ext4")
    await rig.service.create("vols", sandbox_id="sb-1", volumes=[VolumeAttach(data, mount_path="/mnt/data")])
    vm = rig.vm("sb-1")
    await rig.service.delete("sb-1")
    assert vm.fake_guest.calls[-1] == ("volumes_settle", {"paths": ["/mnt/data"], "mode": "freeze"})
    assert vm.state is VmState.KILLED and data.exists()


async def test_a_woken_sandbox_gets_its_volumes_back_not_mounted_again(rig: Rig, tmp_path: Path) -> None:
    data = _image(tmp_path, "data.ext4")
    sandbox = await rig.service.create("vols", sandbox_id="sb-1", volumes=[VolumeAttach(data, mount_path="/d")])
    await rig.service.hibernate("sb-1")
    await rig.service.resume("sb-1")
    woken = rig.vm("sb-1")
    assert woken.restored_from is not None and "qom-set" in woken.qmp_commands()
    assert [v.slot for v in woken.volumes] == ["vol-rw0"] and sandbox.volumes == woken.volumes
    assert "volumes" not in _resume_args(woken)[0]  # its memory has them mounted already


async def test_a_warm_vm_attaches_alongside_the_egress_then_continues(tmp_path: Path) -> None:
    vm = FakeVm("vm-1", SLOTTED, tmp_path, VmState.PAUSED, "")
    order: list[str] = []

    async def egress() -> None:
        order.append(f"egress with {len(vm.qmp_log)} QMP commands sent")

    template = Template("vols", "g1", tmp_path, SLOTTED, {})
    await Lifecycle._bring_up(vm, template, "id-1", [VolumeAttach(_image(tmp_path, "d.ext4"))], alongside=egress())
    assert order and vm.state is VmState.RUNNING and len(vm.volumes) == 1
    assert vm.qmp_commands()[-1] == "qom-set"  # the attach finished before the vCPUs ran
