"""Startup reclaim: kill QEMU processes this data dir started (except the VMs being adopted) and remove their
run directories.

A process is ours when it is a QEMU whose ``-pidfile`` lies under our run directory, so two platforms with
different data dirs on one host never touch each other's VMs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from ...util import procfs
from ..vm.qemu import is_qemu_argv0

log = logging.getLogger(__name__)


def find_own_qemus(run_dir: Path, proc: Path = Path("/proc")) -> list[int]:
    prefix = str(run_dir).rstrip("/") + "/"
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not is_qemu_argv0(argv[0].decode(errors="replace")):
            continue
        args = [a.decode(errors="replace") for a in argv]
        for flag, value in zip(args, args[1:], strict=False):
            if flag == "-pidfile" and value.startswith(prefix):
                pids.append(int(entry.name))
                break
    return pids


def _wait_gone(pid: int, proc: Path, timeout: float) -> None:
    """Until ``pid`` has exited: a zombie has (its memory, fds and taps are released before it becomes one; whoever
    it was re-parented to reaps it when it does: a harness's subreaper or this container's init took ~2 s, and a
    restart waited for them)."""
    deadline = time.monotonic() + timeout
    while procfs.alive(pid, proc) and time.monotonic() < deadline:
        try:
            # reap it if it happens to be our child (an earlier agent in this same process)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.01)


def reclaim(run_dir: Path, proc: Path = Path("/proc"), keep: Mapping[str, int] | None = None) -> int:
    """Kill leftover QEMUs of this run dir, then empty it, except the VMs in ``keep`` (run directory name →
    pid: adopted VMs). Returns how many processes were killed."""
    kept = dict(keep or {})
    pids = [pid for pid in find_own_qemus(run_dir, proc) if pid not in kept.values()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        log.warning("reclaimed leftover QEMU process %d", pid)
    for pid in pids:
        _wait_gone(pid, proc, 5.0)
    if run_dir.exists():
        for child in run_dir.iterdir():
            if child.name in kept:
                continue
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return len(pids)
