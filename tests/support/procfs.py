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
