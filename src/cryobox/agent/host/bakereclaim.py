"""Reclaiming what crashed template bakes leave behind: their QEMUs and their half-built directories.

A bake (:class:`~cryobox.agent.templates.bake.TemplateBaker`) runs a QEMU in its own session whose ``-pidfile`` lies
under ``<data>/bake/bake-<generation[:12]>/`` and whose RAM file is ``<templates>/.<name>-<generation>.baking<pid>/
memory`` (``pid``: the baking process); it builds in that ``.baking<pid>`` directory and renames it
into place when done, holding ``flock`` on ``<templates>/.<name>-<generation>.lock`` meanwhile (``ensure``). A
baker that dies leaves the QEMU running and both directories forever.

A bake is left alone while its baker lives:

- a QEMU, while the baker its RAM path names lives and is its parent or runs cryobox (a jailed QEMU is never
  the baker's child: its launcher exits once it has started);
- a ``.baking<pid>`` directory, while ``pid`` is alive and is a cryobox process (or this process), or while
  someone holds the generation's lock. A live ``pid`` of another program is a reused pid: the baker is dead;
- a bake run directory, while a QEMU of a live bake uses it or its generation's lock is held.

The template dir is shared by every data dir on the host (a bake of another data dir is judged the same way);
the bake dir is this data dir's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...util import procfs
from .reclaim import find_own_qemus

log = logging.getLogger(__name__)

BAKING = re.compile(r"^\.(?P<stem>.+)\.baking(?P<pid>\d+)$")
"""``.<name>-<generation>.baking<pid>``: a bake's work directory in the template dir."""
RUN_DIR = re.compile(r"^bake-(?P<gen>[0-9a-f]+)$")
KILL_WAIT_S = 5.0

Kill = Callable[[int, int], None]


def is_cryobox(pid: int, proc: Path = procfs.PROC) -> bool:
    """``pid`` runs cryobox (its command line names it: ``cryobox serve``, ``python -m cryobox...``)."""
    argv = procfs.cmdline(pid, proc)
    return argv is not None and any("cryobox" in arg for arg in argv)


def baker_of(argv: list[str]) -> int | None:
    """The baking process a bake QEMU's RAM path names (``mem-path=<templates>/.<x>.baking<pid>/memory``)."""
    for arg in argv:
        for part in arg.split(","):
            if part.startswith("mem-path="):
                match = BAKING.match(Path(part[len("mem-path=") :]).parent.name)
                if match:
                    return int(match["pid"])
    return None


@contextlib.contextmanager
def _generation_lock(lock: Path) -> Iterator[bool]:
    """Try the generation's bake lock without waiting: ``True`` (held by us for the block) when nobody bakes it."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        yield True  # never locked: no ``ensure`` is baking it
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _lock_free(lock: Path) -> bool:
    with _generation_lock(lock) as free:
        return free


def _wait_gone(pids: list[int], proc: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while procfs.alive(pid, proc) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it if it happens to be our child
            time.sleep(0.01)


def _kill_qemus(bake_dir: Path, proc: Path, kill: Kill) -> tuple[int, set[Path], set[int]]:
    """Kill QEMUs of dead bakes; returns how many, and the run directories and bakers of the live bakes."""
    killed: list[int] = []
    live: set[Path] = set()
    bakers: set[int] = set()
    for pid in find_own_qemus(bake_dir, proc):
        argv = procfs.cmdline(pid, proc) or []
        found = procfs.stat(pid, proc)
        if found is None:
            continue
        baker = baker_of(argv)
        if baker is None:  # no work dir in its RAM path: judged by its parent
            baker = found.ppid if is_cryobox(found.ppid, proc) else None
        elif baker != found.ppid and not (baker == os.getpid() or is_cryobox(baker, proc)):
            baker = None  # not its parent (a jailed QEMU's never is) and not running cryobox: dead or reused
        pidfile = procfs.flag_value(argv, "-pidfile")
        if baker is not None and procfs.alive(baker, proc):
            bakers.add(baker)
            if pidfile is not None:
                live.add(Path(pidfile).parent)
            continue
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)
            killed.append(pid)
            log.warning("killed QEMU %d of a dead bake (baker %s, pidfile %s)", pid, baker, pidfile)
    _wait_gone(killed, proc, KILL_WAIT_S)
    return len(killed), live, bakers


def _remove_work_dirs(templates_dir: Path, proc: Path, bakers: set[int]) -> int:
    if not templates_dir.is_dir():
        return 0
    removed = 0
    for entry in sorted(templates_dir.iterdir()):
        match = BAKING.match(entry.name)
        if match is None or not entry.is_dir():
            continue
        pid = int(match["pid"])
        running = procfs.alive(pid, proc)
        if running and (pid in bakers or pid == os.getpid() or is_cryobox(pid, proc)):
            continue  # a bake in progress
        with _generation_lock(templates_dir / f".{match['stem']}.lock") as free:
            if running and not free:
                continue  # someone bakes this generation and pid lives: perhaps it is theirs; keep it
            shutil.rmtree(entry, ignore_errors=True)
        removed += 1
        log.warning("removed %s (its baker %d is gone)", entry, pid)
    return removed


def _remove_run_dirs(bake_dir: Path, templates_dir: Path, live: set[Path]) -> int:
    removed = 0
    for entry in sorted(bake_dir.iterdir()) if bake_dir.is_dir() else []:
        match = RUN_DIR.match(entry.name)
        if match is None or not entry.is_dir() or entry in live:
            continue
        locks = templates_dir.glob(f".*-{match['gen']}*.lock") if templates_dir.is_dir() else iter(())
        if not all(_lock_free(lock) for lock in locks):
            continue  # a bake of this generation is under way (between its QEMU and its rename)
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed


def reclaim_bakes_dirs(bake_dir: Path, templates_dir: Path, proc: Path = procfs.PROC, kill: Kill = os.kill) -> int:
    """Kill the QEMUs of dead bakes (``-pidfile`` under ``bake_dir``), then remove the ``.baking<pid>``
    directories of dead bakers from ``templates_dir`` and the bake run directories nobody uses. Returns how
    many things were reclaimed (processes killed + directories removed)."""
    killed, live, bakers = _kill_qemus(bake_dir, proc, kill)
    removed = _remove_work_dirs(templates_dir, proc, bakers) + _remove_run_dirs(bake_dir, templates_dir, live)
    if killed or removed:
        log.warning("reclaimed %d bake QEMU(s) and %d bake director(ies)", killed, removed)
    return killed + removed
