"""A VM's files on tmp paths (disks made by qemu-img) and the bind mounts the jail's spec gives them, for the
jail's and the QEMU binary's tests (nothing is launched)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.jail import JailSettings, VmJail
from cryobox.agent.vm.machine import MachineConfig, MemoryBacking, NetAttach, VmPaths

BASE = 2_000_000


def vm_config(tmp_path: Path, accel: Accel = Accel.TCG, memory_mib: int = 512, cpus: int = 2) -> MachineConfig:
    boot = tmp_path / "cache"
    boot.mkdir(exist_ok=True)
    (boot / "vmlinuz").write_bytes(b"kernel")
    (boot / "initrd.img").write_bytes(b"initrd")
    return MachineConfig(
        memory_mib=memory_mib,
        cpus=cpus,
        accel=accel,
        kernel=boot / "vmlinuz",
        initrd=boot / "initrd.img",
        tsc_khz=2_400_000,
        norandmaps=accel.default_norandmaps,
    )


def qemu_img_create(*args: str) -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *args], check=True, capture_output=True)


class Vm:
    """A VM's files on tmp: a run dir with an overlay backed by a template qcow2 backed by a raw rootfs."""

    def __init__(self, tmp_path: Path, share: bool) -> None:
        self.config = vm_config(tmp_path)
        self.paths = VmPaths(tmp_path / "vm")
        self.paths.root.mkdir()
        templates = tmp_path / "templates"
        templates.mkdir()
        self.raw = templates / "rootfs.raw"
        with open(self.raw, "wb") as fh:
            fh.truncate(1 << 20)
        self.base = templates / "base.qcow2"
        qemu_img_create("-F", "raw", "-b", str(self.raw), str(self.base))
        self.disk = self.paths.disk
        qemu_img_create("-F", "qcow2", "-b", str(self.base), str(self.disk))
        self.memory = MemoryBacking(templates / "memory.img", share=share)
        self.memory.path.write_bytes(b"\0" * 4096)
        self.settings = JailSettings(uid_base=BASE, cgroups=None)
        self.jail = VmJail(self.settings, uid=self.settings.slot_uid(3))

    def spec(self, net: NetAttach | None = None, config: MachineConfig | None = None) -> list[list[str]]:
        return self.jail.spec(config or self.config, self.paths, self.memory, self.disk, net)


def bind_modes(spec: list[list[str]]) -> dict[str, str]:
    binds = [fields for fields in spec if fields[0] == "bind"]
    assert all(len(fields) == 3 for fields in binds)
    found = {path: mode for _, path, mode in binds}
    assert len(found) == len(binds), "a path is bound twice"
    return found
