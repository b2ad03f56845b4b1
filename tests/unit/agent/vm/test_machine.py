"""The QEMU command line derived from a MachineConfig."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.machine import MachineConfig, MemoryBacking, VmPaths, qemu_argv
from cryobox.agent.vm.qemu import QEMU_BINARY


def _config(accel: Accel = Accel.TCG, memory_mib: int = 512, norandmaps: bool | None = None) -> MachineConfig:
    return MachineConfig(
        memory_mib=memory_mib,
        cpus=2,
        accel=accel,
        kernel=Path("/cache/kernel/abc/vmlinuz"),
        initrd=Path("/cache/initramfs/def/initrd.img"),
        tsc_khz=2_400_000,
        norandmaps=accel.default_norandmaps if norandmaps is None else norandmaps,
    )


def _argv(config: MachineConfig, *, share: bool = False, incoming: bool = False) -> list[str]:
    paths = VmPaths(Path("/run/cryobox/vm-1"))
    memory = MemoryBacking(Path("/data/templates/base/memory.img"), share=share)
    return qemu_argv(config, paths, memory, Path("/run/cryobox/vm-1/disk.qcow2"), name="sbx-1", incoming=incoming)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def _memory_backend(argv: list[str]) -> str:
    (backend,) = [v for v in _values(argv, "-object") if v.startswith("memory-backend-file,")]
    return backend


def test_tcg_argv() -> None:
    argv = _argv(_config(Accel.TCG))
    assert argv[0] == QEMU_BINARY
    assert _value(argv, "-name") == "sbx-1"
    assert "pit=on,pic=on,rtc=on" in _value(argv, "-M")
    assert _value(argv, "-M").startswith("microvm,")
    assert "tb-size=" in _value(argv, "-accel")
    assert _value(argv, "-cpu") == "max"
    assert _value(argv, "-smp") == "2"
    assert _value(argv, "-m") == "512M"
    cmdline = _value(argv, "-append").split()
    assert "tsc_early_khz=2400000" in cmdline
    assert "norandmaps" in cmdline
    assert "console=ttyS0" in cmdline
    assert _value(argv, "-kernel") == "/cache/kernel/abc/vmlinuz"
    assert _value(argv, "-initrd") == "/cache/initramfs/def/initrd.img"
    assert _value(argv, "-pidfile") == "/run/cryobox/vm-1/qemu.pid"
    assert "file=/run/cryobox/vm-1/disk.qcow2" in _value(argv, "-drive")


def test_kvm_argv() -> None:
    argv = _argv(_config(Accel.KVM))
    assert _value(argv, "-accel") == "kvm"
    assert _value(argv, "-cpu") == "host"
    assert "pit=off,pic=off" in _value(argv, "-M")
    assert "pit=on" not in _value(argv, "-M")
    cmdline = _value(argv, "-append")
    assert "tsc_early_khz" not in cmdline
    assert "norandmaps" not in cmdline.split()


def test_norandmaps_is_its_own_switch() -> None:
    assert "norandmaps" not in _value(_argv(_config(Accel.TCG, norandmaps=False)), "-append").split()
    assert "norandmaps" in _value(_argv(_config(Accel.KVM, norandmaps=True)), "-append").split()


def test_incoming_adds_deferred_migration() -> None:
    argv = _argv(_config(), incoming=True)
    assert argv[-3:] == ["-S", "-incoming", "defer"]
    plain = _argv(_config(), incoming=False)
    assert "-S" not in plain
    assert "-incoming" not in plain
    assert argv[:-3] == plain


@pytest.mark.parametrize(("share", "flag"), [(True, "share=on"), (False, "share=off")])
def test_memory_backing_share(share: bool, flag: str) -> None:
    backend = _memory_backend(_argv(_config(memory_mib=768), share=share))
    parts = backend.split(",")
    assert flag in parts
    assert "size=768M" in parts
    assert "mem-path=/data/templates/base/memory.img" in parts
    assert "id=ram" in parts
    assert "memory-backend=ram" in _value(_argv(_config()), "-M")


def test_sockets_live_in_run_dir() -> None:
    chardevs = _values(_argv(_config()), "-chardev")
    assert any("path=/run/cryobox/vm-1/qmp.sock" in c for c in chardevs)
    assert any("path=/run/cryobox/vm-1/agent.sock" in c for c in chardevs)
    assert any("path=/run/cryobox/vm-1/console.log" in c for c in chardevs)


def test_identity_tracks_device_model() -> None:
    base = _config(memory_mib=512)
    assert base.identity() == _config(memory_mib=512).identity()
    assert base.identity() != _config(memory_mib=1024).identity()
    assert base.identity()["memory_mib"] == 512
    assert base.identity() != dataclasses.replace(base, cpus=4).identity()
    assert base.identity() != _config(Accel.KVM, memory_mib=512).identity()
    assert base.identity() != dataclasses.replace(base, tsc_khz=3_000_000).identity()
