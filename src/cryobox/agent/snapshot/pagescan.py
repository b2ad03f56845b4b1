"""The kernel's ``PAGEMAP_SCAN`` (Linux 6.7, ``Documentation/admin-guide/mm/pagemap.rst``): the ranges of a
mapping whose pages are in given categories, found by a walk of the page tables that skips what is not mapped.

A ``pagemap`` read returns 8 bytes for every page of the range, mapped or not, so its cost grows with the guest's
RAM, even RAM the guest never touched, and that read is inside every snapshot's pause. ``PAGEMAP_SCAN`` returns
only the matching ranges, and a page table that is not there costs it one step, so its cost does not grow with
untouched RAM (figures: docs/SPECIFICATION.md). (It still looks at every *present* page, as a ``pagemap`` read
does: for a guest that touched all its RAM the two cost about the same.)

Python has no binding; this is the ioctl through :mod:`fcntl` with the structures of ``linux/fs.h``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os

from ...errors import VmmError

PAGE_IS_FILE = 1 << 2
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_SWAPPED = 1 << 4
REGIONS = 4096
"""Ranges asked for per call; the walk goes on from where a full answer stopped."""


class _ScanArg(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "size",
            "flags",
            "start",
            "end",
            "walk_end",
            "vec",
            "vec_len",
            "max_pages",
            "category_inverted",
            "category_mask",
            "category_anyof_mask",
            "return_mask",
        )
    ]


class _Region(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


def _iowr(kind: str, number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord(kind) << 8) | number


PAGEMAP_SCAN = _iowr("f", 16, ctypes.sizeof(_ScanArg))


class Unsupported(Exception):
    """This kernel has no ``PAGEMAP_SCAN`` (before 6.7), or refuses it here."""


def anonymous_runs(pid: int, lo: int, hi: int, regions: int = REGIONS) -> list[tuple[int, int]]:
    """Every run of pages of ``[lo, hi)`` of ``pid`` that are its own: present and not a file page, or swapped
    out (see :mod:`.pagemap`), as ``(offset from lo, length)`` in bytes, maximal and in order.

    :raises Unsupported: no ``PAGEMAP_SCAN`` here (the caller reads ``pagemap`` instead).
    :raises VmmError: the page map could not be read (QEMU exited).
    """
    try:
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise VmmError(f"cannot read the page map of QEMU {pid}: {err}") from err
    vec = (_Region * regions)()
    ranges: list[tuple[int, int]] = []
    start = lo
    try:
        while start < hi:
            arg = _ScanArg(
                size=ctypes.sizeof(_ScanArg),
                start=start,
                end=hi,
                vec=ctypes.addressof(vec),
                vec_len=regions,
                category_inverted=PAGE_IS_FILE,  # not a file page ...
                category_mask=PAGE_IS_FILE,
                category_anyof_mask=PAGE_IS_PRESENT | PAGE_IS_SWAPPED,  # ... and present or swapped
                return_mask=PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            )
            try:
                found = fcntl.ioctl(fd, PAGEMAP_SCAN, arg)
            except OSError as err:
                if err.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                    raise Unsupported(str(err)) from None
                raise VmmError(f"cannot scan the page map of QEMU {pid}: {err}") from err
            ranges += [(region.start - lo, region.end - lo) for region in vec[:found]]
            if arg.walk_end >= hi:
                break
            if arg.walk_end <= start:
                raise VmmError(f"the page map scan of QEMU {pid} stopped at {arg.walk_end:#x}")
            start = arg.walk_end
    finally:
        os.close(fd)
    return _union(ranges)


def _union(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[start, end)`` ranges as maximal ``(start, length)`` runs, in order. Adjacent ones join (present next to
    swapped pages come as two); overlapping ones too: this host's kernel (6.18) sometimes answers one call with
    the matching ranges up to the end and then some of them again from an earlier address (918 ranges for 715
    runs; every page the same as a ``pagemap`` read finds, none missing:
    ``tests/unit/agent/snapshot/test_pagescan.py``)."""
    runs: list[tuple[int, int]] = []
    end = -1
    for start, stop in sorted(ranges):
        if runs and start <= end:
            end = max(end, stop)
            runs[-1] = (runs[-1][0], end - runs[-1][0])
        else:
            runs.append((start, stop - start))
            end = stop
    return runs
