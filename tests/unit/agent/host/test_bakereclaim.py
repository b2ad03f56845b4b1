"""Leftovers of crashed template bakes: QEMUs of dead bakers are killed, ``.baking<pid>`` directories of dead
bakers (or of pids now running something else) and unused bake run directories are removed; live bakes stay."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.host.bakereclaim import baker_of, reclaim_bakes_dirs

GEN = "abc123def4567890"
GEN2 = "fedcba9876543210"
GEN3 = "13579bdf02468ace"


class FakeProc:
    """A /proc tree with the files the reclaim reads (cmdline, stat); ``kill`` removes a process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.killed: list[tuple[int, int]] = []

    def add(self, pid: int, argv: list[str], ppid: int = 1, state: str = "S") -> None:
        entry = self.root / str(pid)
        entry.mkdir()
        (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        rest = [state, str(ppid)] + ["0"] * 17 + ["100"] + ["0"] * 10
        (entry / "stat").write_text(f"{pid} ({Path(argv[0]).name[:15]}) {' '.join(rest)}\n")

    def kill(self, pid: int, sig: int) -> None:
        self.killed.append((pid, sig))
        for name in ("cmdline", "stat"):
            (self.root / str(pid) / name).unlink()
        (self.root / str(pid)).rmdir()


def qemu(templates: Path, bake_dir: Path, baker: int, gen: str = GEN) -> list[str]:
    return [
        "/usr/bin/qemu-system-x86_64",
        "-object",
        f"memory-backend-file,id=ram,size=512M,mem-path={templates}/.base-{gen}.baking{baker}/memory,share=on",
        "-pidfile",
        f"{bake_dir}/bake-{gen[:12]}/qemu.pid",
    ]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    templates, bake_dir = tmp_path / "templates", tmp_path / "data" / "bake"
    templates.mkdir()
    bake_dir.mkdir(parents=True)
    return templates, bake_dir


def test_baker_is_read_from_the_ram_path(dirs: tuple[Path, Path]) -> None:
    templates, bake_dir = dirs
    assert baker_of(qemu(templates, bake_dir, 4242)) == 4242
    assert (
        baker_of(["/usr/bin/qemu-system-x86_64", "-object", "memory-backend-file,mem-path=/dev/shm/x/memory"]) is None
    )


def test_dead_bakes_are_reclaimed_and_live_ones_left_alone(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    templates, bake_dir = dirs
    proc = FakeProc(tmp_path / "proc")
    # bakers: 100 dead; 200 alive but a reused pid (bash); 300 a live cryobox; 400 alive, its generation locked;
    # 500 alive (not cryobox) and the parent of its live bake QEMU
    proc.add(200, ["bash"])
    proc.add(300, ["/opt/venv/bin/python", "-m", "cryobox.cli.main", "serve"])
    proc.add(400, ["vim"])
    proc.add(500, ["/usr/bin/python3", "-m", "pytest"])
    proc.add(600, ["sleep", "9"], state="Z")  # exited, not reaped yet: dead
    work = {pid: templates / f".base-{GEN}.baking{pid}" for pid in (100, 200, 300, 500, 600)}
    work[400] = templates / f".code-{GEN2}.baking400"
    for path in work.values():
        path.mkdir()
        (path / "memory").write_bytes(b"x")
    finished = templates / f"base-{GEN}"
    finished.mkdir()
    (templates / f".base-{GEN}.lock").touch()
    lock = templates / f".code-{GEN2}.lock"
    lock.touch()

    proc.add(1000, qemu(templates, bake_dir, 100), ppid=1)  # its baker died: reparented
    proc.add(1001, qemu(templates, bake_dir, 500, gen=GEN2[::-1]), ppid=500)  # a live bake
    proc.add(1002, qemu(templates, bake_dir, 300, gen=GEN3), ppid=300)  # its parent is a live cryobox: a live bake
    other = tmp_path / "other" / "bake"
    proc.add(1003, qemu(templates, other, 100), ppid=1)  # another data dir's: not ours to judge
    proc.add(1004, ["/usr/bin/qemu-system-x86_64", "-pidfile", f"{bake_dir}/bake-{GEN[:12]}/qemu.pid"], ppid=1)
    live_run, dead_run = bake_dir / f"bake-{GEN2[::-1][:12]}", bake_dir / f"bake-{GEN[:12]}"
    locked_run, cryobox_run = bake_dir / f"bake-{GEN2[:12]}", bake_dir / f"bake-{GEN3[:12]}"
    for run in (live_run, dead_run, locked_run, cryobox_run):
        run.mkdir()
    (bake_dir / "notes.txt").write_text("not a run dir")

    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # somebody bakes code-GEN2 right now
        count = reclaim_bakes_dirs(bake_dir, templates, proc.root, kill=proc.kill)
        # the lock is free again afterwards (the reclaim took and released its own only where it was free)
    with open(lock) as again:
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)

    assert sorted(proc.killed) == [(1000, signal.SIGKILL), (1004, signal.SIGKILL)]
    assert (proc.root / "1001").exists() and (proc.root / "1002").exists() and (proc.root / "1003").exists()
    gone = {pid for pid, path in work.items() if not path.exists()}
    assert gone == {100, 200, 600}
    assert finished.exists() and (templates / f".base-{GEN}.lock").exists()
    assert not dead_run.exists() and live_run.exists() and locked_run.exists() and cryobox_run.exists()
    assert (bake_dir / "notes.txt").exists()
    assert count == 2 + 3 + 1

    # the lock is free now: 400 is just a live vim (a reused pid), and nobody bakes GEN2 any more
    assert reclaim_bakes_dirs(bake_dir, templates, proc.root, kill=proc.kill) == 2
    assert not work[400].exists() and not locked_run.exists()


def test_missing_dirs_are_fine(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    assert reclaim_bakes_dirs(tmp_path / "nope", tmp_path / "none", tmp_path / "proc") == 0


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_real_processes(dirs: tuple[Path, Path], tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    templates, bake_dir = dirs
    sleeper = "import time; time.sleep(60)"
    dead = subprocess.Popen(["true"])
    dead.wait()
    reused = subprocess.Popen(["sleep", "60"])  # alive, but not a baker: its pid was reused
    baker = subprocess.Popen([sys.executable, "-c", sleeper, "cryobox-bake"])  # a live cryobox process
    started += [reused, baker]
    for pid in (dead.pid, reused.pid, baker.pid, os.getpid()):
        (templates / f".base-{GEN}.baking{pid}").mkdir()
    fake_qemu = tmp_path / "bin" / "qemu-system-x86_64"
    fake_qemu.parent.mkdir()
    fake_qemu.symlink_to(sys.executable)
    orphan = subprocess.Popen(  # a bake QEMU whose baker (dead) is not its parent
        [str(fake_qemu), "-c", sleeper, *qemu(templates, bake_dir, dead.pid)[1:]], executable=str(fake_qemu)
    )
    ours = subprocess.Popen(  # a bake QEMU of this (live) process: its parent
        [str(fake_qemu), "-c", sleeper, *qemu(templates, bake_dir, os.getpid(), gen=GEN2)[1:]],
        executable=str(fake_qemu),
    )
    started += [orphan, ours]
    deadline = time.monotonic() + 10
    while not all(Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(str(fake_qemu).encode()) for p in started[2:]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (bake_dir / f"bake-{GEN[:12]}").mkdir()
    (bake_dir / f"bake-{GEN2[:12]}").mkdir()

    count = reclaim_bakes_dirs(bake_dir, templates)

    # killed: SIGKILL, or 0 when the reclaim's own waitpid reaped it first (the test is its parent, and Popen reads
    # the ECHILD that follows as 0); the sleeper cannot end by itself in the test's time
    assert orphan.wait(timeout=10) in (-signal.SIGKILL, 0)
    assert ours.poll() is None and reused.poll() is None and baker.poll() is None
    left = sorted(p.name for p in templates.iterdir())
    assert left == sorted(f".base-{GEN}.baking{pid}" for pid in (baker.pid, os.getpid()))
    assert sorted(p.name for p in bake_dir.iterdir()) == [f"bake-{GEN2[:12]}"]
    assert count == 1 + 2 + 1
