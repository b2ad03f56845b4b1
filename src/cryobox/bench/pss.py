"""Proportional set size (Pss) of processes, from ``/proc/<pid>/smaps_rollup``.

Pss charges each resident page to the processes mapping it in equal parts, so the Pss of a group of processes
sums to the memory the group costs the host: pages private to one process count fully, a page shared by ``k``
processes counts ``1/k`` in each.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_KIB = 1024
_RANGE = re.compile(r"^[0-9a-f]+-[0-9a-f]+$")


def parse_rollup(text: str) -> dict[str, int]:
    """The ``<Name>: <n> kB`` lines of an ``smaps_rollup`` (or ``smaps``/``status``) file, in KiB.

    Lines that are not of that form (the header naming the address range, ``VmFlags``) are skipped.
    """
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or len(parts) != 2 or parts[1] != "kB" or not parts[0].isdigit():
            continue
        fields[name.strip()] = int(parts[0])
    return fields


def mapping_kib(smaps: str, pathname: str) -> dict[str, int]:
    """The ``<Name>: <n> kB`` fields of an ``smaps`` file summed over the mappings of ``pathname`` (a mapping of
    a file unlinked since is listed as ``<pathname> (deleted)`` and counts too)."""
    totals: dict[str, int] = {}
    inside = False
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if head and _RANGE.match(head[0]):  # a mapping's header: range perms offset dev inode [pathname]
            path = head[5] if len(head) == 6 else ""
            inside = path == pathname or path == f"{pathname} (deleted)"
            continue
        if inside:
            for name, kib in parse_rollup(line).items():
                totals[name] = totals.get(name, 0) + kib
    return totals


def smaps_mapping_kib(pid: int, pathname: Path, proc: Path = Path("/proc")) -> dict[str, int]:
    """:func:`mapping_kib` of a live process.

    :raises RuntimeError: the process is gone or does not map ``pathname``.
    """
    try:
        text = (proc / str(pid) / "smaps").read_text()
    except OSError as err:
        raise RuntimeError(f"cannot read smaps of pid {pid}: {err}") from err
    fields = mapping_kib(text, str(pathname))
    if "Pss" not in fields:
        raise RuntimeError(f"pid {pid} does not map {pathname}")
    return fields


def rollup_kib(pid: int, field: str = "Pss", proc: Path = Path("/proc")) -> int:
    """``field`` (``Pss``, ``Rss``, ``Pss_Shmem``, ...) of one process, in KiB.

    :raises RuntimeError: the process is gone or its rollup has no such line.
    """
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError as err:
        raise RuntimeError(f"cannot read smaps_rollup of pid {pid}: {err}") from err
    fields = parse_rollup(text)
    if field not in fields:
        raise RuntimeError(f"smaps_rollup of pid {pid} has no {field!r} line")
    return fields[field]


def sum_mib(pids: Iterable[int], field: str = "Pss", proc: Path = Path("/proc")) -> float:
    """Sum of ``field`` over ``pids``, in MiB."""
    return sum(rollup_kib(pid, field, proc) for pid in pids) / _KIB


def allocated_bytes(path: Path) -> int:
    """Bytes a (possibly sparse) file actually occupies: its allocated blocks, not its length."""
    return path.stat().st_blocks * 512
