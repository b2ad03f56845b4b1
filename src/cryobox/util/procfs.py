"""Reading ``/proc`` (an injectable root, so tests can hand in a fake tree): command lines and start times."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_STARTTIME_FIELD = 22  # field 22 of /proc/<pid>/stat, counting from 1 (man 5 proc)


@dataclass(frozen=True)
class ProcStat:
    state: str
    """One letter: ``R``, ``S``, ``Z`` (a zombie: its pid cannot be reused until its parent reaps it), ..."""
    ppid: int
    started_at: float
    """Seconds since boot (``CLOCK_BOOTTIME``) when the process started, to the clock tick (10 ms)."""


def boot_clock() -> float:
    """Seconds since boot (``CLOCK_BOOTTIME``): monotonic, the same in every process, the clock of start times."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def pids(proc: Path = PROC) -> Iterator[int]:
    try:
        entries = list(proc.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.isdigit():
            yield int(entry.name)


def cmdline(pid: int, proc: Path = PROC) -> list[str] | None:
    """The process's argv (empty for a zombie or a kernel thread), or ``None`` when it is gone."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    parts = raw.split(b"\0")
    if parts[-1] == b"":
        parts.pop()
    return [arg.decode(errors="replace") for arg in parts]


def stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """State and start time of ``pid``, or ``None`` when it is gone (or its ``stat`` is unreadable)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
    fields = text[text.rfind(")") + 1 :].split()
    try:
        ppid, ticks = int(fields[1]), int(fields[_STARTTIME_FIELD - 3])
    except (IndexError, ValueError):
        return None
    return ProcStat(state=fields[0], ppid=ppid, started_at=ticks / os.sysconf("SC_CLK_TCK"))


def alive(pid: int, proc: Path = PROC) -> bool:
    """``pid`` exists and is not a zombie (a zombie has exited: only its exit status is left)."""
    found = stat(pid, proc)
    return found is not None and found.state not in ("Z", "X")


def holders(path: Path, proc: Path = PROC) -> list[int]:
    """The processes with ``path`` open (compared by device and inode, so whatever path their mount namespace
    shows it by): for an error that names who holds a file. Scans every process's fds: diagnostics only."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    found = []
    for pid in pids(proc):
        try:
            fds = os.listdir(proc / str(pid) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(proc / str(pid) / "fd" / fd)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):
                found.append(pid)
                break
    return sorted(found)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``argv`` (``-pidfile X``), or ``None``."""
    for name, value in zip(argv, argv[1:], strict=False):
        if name == flag:
            return value
    return None


def is_under(path: str, root: Path) -> bool:
    """``path`` lies inside the directory ``root`` (textually: neither needs to exist)."""
    prefix = str(root).rstrip("/") + "/"
    return path.startswith(prefix)


def process_start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time in clock ticks since boot, or ``None`` if it does not exist (or is a zombie)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):  # zombie or dead: gone for our purposes
        return None
    try:
        return int(fields[19])  # field 22 of the whole line; fields here start at field 3
    except (IndexError, ValueError):
        return None
