"""A fake ``/proc``: entries that name real (harmless) processes as QEMUs of a data dir, for reclaim and
adoption."""

from __future__ import annotations

from pathlib import Path

QEMU = "/usr/bin/qemu-system-x86_64"


def fake_proc_entry(proc: Path, pid: int | str, argv: list[str] | None) -> Path:
    entry = proc / str(pid)
    entry.mkdir(parents=True)
    if argv is not None:
        (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    return entry


def fake_usage(proc: Path, pid: int, *, utime: int, stime: int = 0, rss_kib: int = 0) -> Path:
    """``/proc/<pid>/stat`` and ``status`` of a process that used ``utime + stime`` clock ticks and holds
    ``rss_kib`` (written again on each call: the process ran on)."""
    entry = proc / str(pid)
    entry.mkdir(parents=True, exist_ok=True)
    fields = ["S", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 30  # fields 3-4, 5-13, 14-15, ...
    (entry / "stat").write_text(f"{pid} (qemu sys (x)) {' '.join(fields)}\n")
    (entry / "status").write_text(f"Name:\tqemu\nVmRSS:\t  {rss_kib} kB\nThreads:\t4\n")
    return entry
