"""Volume slots in the machine config: empty virtio disks after every other device, each with a QOM id and a
serial, read-only ones baked read-only; they are part of the identity (a template generation) and of the JSON a
manifest keeps; a machine without slots has exactly the argv it had before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.machine import MachineConfig, MemoryBacking, VmPaths, qemu_argv
from cryobox.agent.vm.slots import RO_SLOTS, RW_SLOTS, VolumeSlot, device_name, slot_args, volume_slots


def _config(*, rw: int = 0, ro: int = 0, agent_disk: Path | None = None, nic: bool = True) -> MachineConfig:
    return MachineConfig(
        memory_mib=512,
        cpus=1,
        accel=Accel.TCG,
        kernel=Path("/k/vmlinuz"),
        initrd=Path("/k/initrd"),
        tsc_khz=2_400_000,
        norandmaps=True,
        nic=nic,
        agent_disk=agent_disk,
        rw_volume_slots=rw,
        ro_volume_slots=ro,
    )


def _argv(config: MachineConfig, *, incoming: bool = True) -> list[str]:
    paths, memory = VmPaths(Path("/run/vm-1")), MemoryBacking(Path("/m"), share=False)
    return qemu_argv(config, paths, memory, Path("/run/vm-1/disk.qcow2"), name="vm", incoming=incoming)


def _devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]


def test_slot_names_serials_and_nodes() -> None:
    rw, ro = VolumeSlot(False, 0), VolumeSlot(True, 3)
    assert (rw.id, rw.serial) == ("vol-rw0", "cbx-vol-rw0")
    assert (rw.empty_node, rw.volume_node) == ("vol-rw0-empty", "vol-rw0-volume")
    assert ro.id == "vol-ro3" and ro.qom_path == "/machine/peripheral/vol-ro3"
    assert all(len(s.serial) <= 20 for s in volume_slots(RW_SLOTS, RO_SLOTS))  # VIRTIO_BLK_ID_BYTES
    assert [s.id for s in volume_slots(2, 1)] == ["vol-rw0", "vol-rw1", "vol-ro0"]


def test_slot_args_are_empty_null_nodes_under_named_devices() -> None:
    argv = slot_args(volume_slots(1, 1))
    assert argv == [
        "-blockdev",
        "driver=null-co,node-name=vol-rw0-empty,size=0,read-zeroes=on",
        "-device",
        "virtio-blk-device,drive=vol-rw0-empty,id=vol-rw0,serial=cbx-vol-rw0,write-cache=on",
        "-blockdev",
        "driver=null-co,node-name=vol-ro0-empty,size=0,read-zeroes=on,read-only=on",
        "-device",
        "virtio-blk-device,drive=vol-ro0-empty,id=vol-ro0,serial=cbx-vol-ro0,write-cache=on",
    ]


def test_slots_come_last_before_incoming() -> None:
    argv = _argv(_config(rw=RW_SLOTS, ro=RO_SLOTS))
    devices = _devices(argv)
    assert devices[-RW_SLOTS - RO_SLOTS - 1].startswith("virtio-net-device")  # every other device keeps its place
    assert [d.split("id=")[1].split(",")[0] for d in devices[-8:]] == [s.id for s in volume_slots(4, 4)]
    assert argv[-3:] == ["-S", "-incoming", "defer"]
    assert argv.index("-blockdev") > argv.index("-netdev")


def test_a_machine_without_slots_is_unchanged() -> None:
    plain = _config()
    argv = _argv(plain)
    assert "-blockdev" not in argv and not any("vol-" in a for a in argv)
    assert "volume_slots" not in plain.identity() and "rw_volume_slots" not in plain.to_json()
    assert plain.volume_slots == ()


def test_slots_survive_a_manifest_and_change_the_identity() -> None:
    config = _config(rw=4, ro=4)
    assert MachineConfig.from_json(config.to_json()) == config
    assert config.identity() != _config().identity()
    assert config.identity() != _config(rw=4, ro=3).identity()
    assert MachineConfig.from_json(_config().to_json()).volume_slots == ()  # a manifest from before slots


NAMES = [(0, "vda"), (1, "vdb"), (25, "vdz"), (26, "vdaa"), (27, "vdab"), (701, "vdzz")]


@pytest.mark.parametrize(("index", "name"), NAMES)
def test_device_names_follow_the_kernel(index: int, name: str) -> None:
    assert device_name(index) == name


def test_slot_devices_follow_the_root_and_agent_disks() -> None:
    config = _config(rw=2, ro=2)
    assert [config.slot_device(s) for s in config.volume_slots] == ["vdb", "vdc", "vdd", "vde"]
    with_agent = dataclasses.replace(config, agent_disk=Path("/a/agent.ext4"))
    assert [with_agent.slot_device(s) for s in with_agent.volume_slots] == ["vdc", "vdd", "vde", "vdf"]
