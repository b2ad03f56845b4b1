"""Startup reclaim against a fake /proc, with real (harmless) sleep children as the targets."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.host.reclaim import find_own_qemus, reclaim
from tests.support.procfs import QEMU, fake_proc_entry


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for child in started:
            child.kill()
        for child in started:
            child.wait(timeout=10)


def _spawn(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(["sleep", "60"])
    children.append(child)
    return child


def _populate(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> tuple[Path, Path, int, list[int]]:
    run_dir = tmp_path / "data" / "run"
    proc = tmp_path / "proc"
    proc.mkdir()
    ours, theirs, not_qemu, sibling = (_spawn(children) for _ in range(4))
    fake_proc_entry(proc, ours.pid, [QEMU, "-name", "x", "-pidfile", f"{run_dir}/vm-1/qemu.pid"])
    # a QEMU of another data dir
    fake_proc_entry(proc, theirs.pid, [QEMU, "-name", "y", "-pidfile", f"{tmp_path}/other/run/vm-1/qemu.pid"])
    # not a QEMU, even though a -pidfile points into our run dir
    fake_proc_entry(proc, not_qemu.pid, ["/usr/bin/python3", "-pidfile", f"{run_dir}/vm-2/qemu.pid"])
    # a sibling dir that merely shares our run dir's name as a prefix
    fake_proc_entry(proc, sibling.pid, [QEMU, "-pidfile", f"{run_dir}2/vm-1/qemu.pid"])
    # noise: non-pid entries, an unreadable entry, an empty cmdline (kernel thread)
    fake_proc_entry(proc, "self", [QEMU, "-pidfile", f"{run_dir}/vm-9/qemu.pid"])
    fake_proc_entry(proc, 999_999_999, None)
    fake_proc_entry(proc, 999_999_998, [])
    (proc / "uptime").write_text("1.0 1.0\n")
    return run_dir, proc, ours.pid, [theirs.pid, not_qemu.pid, sibling.pid]


def test_find_own_qemus(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    run_dir, proc, ours, _ = _populate(tmp_path, children)
    assert find_own_qemus(run_dir, proc) == [ours]
    # a trailing slash on the run dir changes nothing
    assert find_own_qemus(Path(f"{run_dir}/"), proc) == [ours]
    assert all(child.poll() is None for child in children)


def test_reclaim_kills_only_ours_and_empties_run_dir(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    run_dir, proc, ours, others = _populate(tmp_path, children)
    (run_dir / "vm-1").mkdir(parents=True)
    (run_dir / "vm-1" / "qemu.pid").write_text(f"{ours}\n")
    (run_dir / "vm-1" / "nested").mkdir()
    (run_dir / "vm-1" / "nested" / "disk.qcow2").write_bytes(b"qcow")
    (run_dir / "vm-2").mkdir()
    (run_dir / "stray.sock").write_text("")
    other_run = tmp_path / "other" / "run" / "vm-1"
    other_run.mkdir(parents=True)

    target = next(c for c in children if c.pid == ours)

    def vanish_when_dead() -> None:
        # the kernel drops /proc/<pid> once the process is reaped; mirror that in the fake proc
        target.wait(timeout=30)
        shutil.rmtree(proc / str(ours))

    watcher = threading.Thread(target=vanish_when_dead, daemon=True)
    watcher.start()
    try:
        assert reclaim(run_dir, proc) == 1
    finally:
        if watcher.is_alive():
            target.kill()
        watcher.join(timeout=30)

    assert target.poll() is not None
    for child in children:
        if child.pid in others:
            assert child.poll() is None, f"reclaim killed unrelated pid {child.pid}"
    assert run_dir.is_dir()
    assert list(run_dir.iterdir()) == []
    assert other_run.is_dir()


def test_reclaim_creates_missing_run_dir(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    run_dir = tmp_path / "fresh" / "run"
    assert reclaim(run_dir, proc) == 0
    assert run_dir.is_dir()
