"""The agent disk in the machine config: the second virtio disk (the guest's vdb), read-only, named on the
kernel command line, kept through to_json/from_json; a machine without it is what it always was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.machine import MachineConfig, MemoryBacking, VmPaths, qemu_argv

AGENT = Path("/cache/agentdisk/abc/agent.ext4")


def _config(agent_disk: Path | None = None) -> MachineConfig:
    return MachineConfig(
        memory_mib=512,
        cpus=1,
        accel=Accel.TCG,
        kernel=Path("/cache/kernel/abc/vmlinuz"),
        initrd=Path("/cache/initramfs/def/initrd.img"),
        tsc_khz=2_400_000,
        norandmaps=True,
        nic=True,
        agent_disk=agent_disk,
    )


def _argv(config: MachineConfig, data_disks: tuple[Path, ...] = ()) -> list[str]:
    paths = VmPaths(Path("/run/cryobox/vm-1"))
    memory = MemoryBacking(Path("/data/memory"), share=False)
    disk = Path("/run/cryobox/vm-1/disk.qcow2")
    return qemu_argv(config, paths, memory, disk, name="vm", incoming=True, data_disks=data_disks)


def test_the_agent_disk_is_the_read_only_disk_right_after_the_root_disk() -> None:
    argv = _argv(_config(AGENT), data_disks=(Path("/x/data.img"),))
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device" and "virtio-blk" in argv[i + 1]]
    assert devices == [
        "virtio-blk-device,drive=root",
        "virtio-blk-device,drive=agent",
        "virtio-blk-device,drive=data0",
    ]
    drive = next(argv[i + 1] for i, a in enumerate(argv) if a == "-drive" and "id=agent" in argv[i + 1])
    assert f"file={AGENT}" in drive and "readonly=on" in drive and "format=raw" in drive
    assert _config(AGENT).kernel_cmdline.endswith(" cryobox.agentdisk=/dev/vdb")


def test_a_machine_without_it_is_unchanged() -> None:
    plain = _config()
    assert "agentdisk" not in plain.kernel_cmdline
    assert "agent_disk" not in plain.identity() and "agent_disk" not in plain.to_json()
    assert "drive=agent" not in " ".join(_argv(plain))
    assert plain.host_files() == {"kernel": str(plain.kernel), "initrd": str(plain.initrd)}


def test_it_survives_a_manifest_and_changes_the_identity() -> None:
    config = _config(AGENT)
    assert MachineConfig.from_json(config.to_json()) == config
    assert config.identity() != _config().identity()
    assert config.host_files()["agent_disk"] == str(AGENT)
    moved = MachineConfig.from_json(
        dict(config.to_json(), **dataclasses.replace(config, agent_disk=Path("/b")).host_files())
    )
    assert moved.agent_disk == Path("/b")
