"""``CRYOBOX_QEMU``: which QEMU binary runs the VMs, read in one place (``agent/vm/qemu.py``) and used by the
command line, the version probe, the jail and the process scans that recognise our QEMUs (nothing is launched
but a fake ``--version`` script)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.host import gc
from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.vm import qemu
from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.machine import MachineConfig, MemoryBacking, VmPaths, qemu_argv
from cryobox.errors import InvalidArgument
from tests.support.jail import Vm, bind_modes  # the jail spec's VM files (disks made by qemu-img)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """``binary()`` and ``version_line()`` are read once per process: clear them around every test."""
    qemu.binary.cache_clear()
    qemu.version_line.cache_clear()
    yield
    qemu.binary.cache_clear()
    qemu.version_line.cache_clear()


def private_qemu(root: Path, version: str = "10.0.2", name: str = "qemu-system-x86_64") -> Path:
    """A prefix laid out like ``make qemu10``'s: ``usr/bin/<name>`` (a script answering ``--version``) and the
    firmware directories."""
    binary = root / "usr" / "bin" / name
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\necho 'QEMU emulator version {version} (Debian test)'\n")
    binary.chmod(0o755)
    for rel in ("usr/share/qemu", "usr/share/seabios"):
        (root / rel).mkdir(parents=True)
    return binary


def test_default_is_the_system_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(qemu.ENV_QEMU, raising=False)
    assert qemu.binary() == "qemu-system-x86_64"
    assert qemu.install_prefix() is None
    assert qemu.firmware_args() == []
    monkeypatch.setenv(qemu.ENV_QEMU, "  ")
    qemu.binary.cache_clear()
    assert qemu.binary() == "qemu-system-x86_64"


def test_private_binary_is_used_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = private_qemu(tmp_path / "qemu-10")
    monkeypatch.setenv(qemu.ENV_QEMU, str(binary))
    assert qemu.binary() == str(binary)
    assert qemu.version_line() == "QEMU emulator version 10.0.2 (Debian test)"
    assert qemu.version() == (10, 0)
    assert qemu.private_readonly() and not qemu.option_roms_off() and not qemu.background_snapshot_resumes()
    assert qemu.install_prefix() == tmp_path / "qemu-10"
    assert qemu.firmware_args() == [
        "-L",
        str(tmp_path / "qemu-10" / "usr/share/qemu"),
        "-L",
        str(tmp_path / "qemu-10" / "usr/share/seabios"),
    ]  # no usr/lib/ipxe/qemu in this prefix: not passed

    config = MachineConfig(512, 1, Accel.TCG, tmp_path / "vmlinuz", tmp_path / "initrd", 2_000_000, True)
    paths = VmPaths(tmp_path / "run" / "vm-1")
    argv = qemu_argv(
        config, paths, MemoryBacking(tmp_path / "memory", share=False), paths.disk, name="x", incoming=False
    )
    assert argv[:5] == [str(binary), "-L", f"{tmp_path}/qemu-10/usr/share/qemu", "-L", argv[4]]
    assert "x-option-roms=off" not in argv[argv.index("-M") + 1]
    assert "readonly=on,rom=off" in next(a for a in argv if a.startswith("memory-backend-file"))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("relative/qemu-system-x86_64", "absolute"),
        ("/usr/bin/true", "named qemu-system-x86_64"),
        ("/nonexistent/qemu-system-x86_64", "not an executable"),
    ],
)
def test_bad_values_are_refused(value: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        qemu.resolve_binary(value)


def test_argv0_recognition() -> None:
    for arg in (
        "qemu-system-x86_64",
        "/usr/bin/qemu-system-x86_64",
        "/opt/cryobox/qemu-10.0.2/usr/bin/qemu-system-x86_64",
        "/opt/cryobox/qemu-10.0.2/usr/bin/qemu-system-x86_64-microvm",
    ):
        assert qemu.is_qemu_argv0(arg), arg
    for arg in ("/usr/bin/python3", "/tmp/qemu-system-x86_64/python3", "qemu-img", ""):
        assert not qemu.is_qemu_argv0(arg), arg


def test_prefix_of() -> None:
    assert qemu.prefix_of("/opt/q/usr/bin/qemu-system-x86_64") == Path("/opt/q")
    assert qemu.prefix_of("/usr/bin/qemu-system-x86_64") is None
    assert qemu.prefix_of("/opt/q/bin/qemu-system-x86_64") is None
    assert qemu.prefix_of("qemu-system-x86_64") is None


def test_reclaim_and_gc_recognise_a_private_binary(tmp_path: Path) -> None:
    run_dir = tmp_path / "data" / "vol" / "run"
    proc = tmp_path / "proc"
    private = "/opt/cryobox/qemu-10.0.2/usr/bin/qemu-system-x86_64"
    for pid, argv0 in ((101, private), (102, "/usr/bin/qemu-system-x86_64"), (103, "/usr/bin/python3")):
        (proc / str(pid)).mkdir(parents=True)
        argv = [argv0, "-name", "x", "-pidfile", f"{run_dir}/vm-{pid}/qemu.pid"]
        (proc / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    assert sorted(find_own_qemus(run_dir, proc)) == [101, 102]
    assert gc._is_qemu(gc.ProcInfo(101, (private, "-pidfile", f"{run_dir}/vm-101/qemu.pid")))
    assert not gc._is_qemu(gc.ProcInfo(103, ("/usr/bin/python3",)))


def test_jail_binds_a_private_prefix_and_opens_the_image_to_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = private_qemu(tmp_path / "opt" / "qemu-10")
    monkeypatch.setenv(qemu.ENV_QEMU, str(binary))
    vm = Vm(tmp_path, share=False)
    binds = bind_modes(vm.spec())
    assert binds[str(tmp_path / "opt" / "qemu-10")] == "ro"
    assert binds[str(vm.memory.path)] == "ro"  # 10.0 opens a private image read-only

    monkeypatch.setattr(os, "chown", lambda path, uid, gid: None)
    vm.jail.prepare(vm.paths, vm.memory, vm.disk)
    assert vm.memory.path.stat().st_mode & 0o777 == 0o640  # readable by the image group the VM runs in


def test_jail_binds_no_prefix_for_the_system_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(qemu.ENV_QEMU, raising=False)
    monkeypatch.setattr(qemu, "version_line", lambda: "QEMU emulator version 7.2.22 (Debian)")
    binds = bind_modes(Vm(tmp_path, share=False).spec())
    assert not any(path.startswith(str(tmp_path / "opt")) for path in binds)
