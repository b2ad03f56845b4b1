"""Which pages of a restored VM's RAM the guest has written: ``/proc/<qemu>/pagemap`` over its RAM mapping.

A restore maps its parent image ``MAP_PRIVATE`` (``share=off``): a page the guest never wrote is still the
parent file's page-cache page, a page it wrote is the process's own anonymous copy. ``pagemap`` has one 64-bit
entry per virtual page (``Documentation/admin-guide/mm/pagemap.rst``): bit 63 present, bit 62 swapped, bit 61
"file-page or shared-anon". So a page is *written* if it is present and not a file page, or swapped out (only
anonymous pages of this mapping can be swapped; file pages are dropped and re-read instead).

A written page never turns back into a file page (QEMU discards guest RAM only for balloon/virtio-mem devices,
which cryobox VMs do not have), so an answer "not written" read at any instant after a pause holds for the
pause too: a page that is still the file's at the time we look had the file's content when the guest stopped.
That is what lets a snapshot's consumer ask while QEMU streams, with a window cached. For a background
snapshot a stale "not written" entry could only matter if the page changed before the pause, which it cannot
have. A stream that sends pages again (a pre-copy migration: tried, not shipped, see docs/design/snapshots.md)
may carry a page the guest wrote after our window was read, so the consumer drops the window whenever it
reads more of the stream (:meth:`invalidate`), which keeps the sinks right for either kind of stream:
an entry read after a record arrived tells the truth about the bytes that record carries.
"""

from __future__ import annotations

import os
import re
import struct
from concurrent.futures import ThreadPoolExecutor

from ...errors import VmmError
from .pagescan import Unsupported, anonymous_runs

PAGE_SIZE = 4096
PRESENT = 1 << 63
SWAPPED = 1 << 62
FILE_PAGE = 1 << 61
WINDOW_PAGES = 8192  # entries read at once: 64 KiB of pagemap for 32 MiB of guest RAM
READERS = 2
PARALLEL_PAGES = 1 << 17  # 512 MiB of RAM and more: read in parts


class WrittenPages:
    """Answers "has the process written page ``offset`` of its private mapping ``[lo, hi)``?".

    Open one per capture (:meth:`close` when done); reads ``pagemap`` in windows of :data:`WINDOW_PAGES`.
    """

    def __init__(self, pid: int, lo: int, hi: int, window_pages: int = WINDOW_PAGES) -> None:
        if lo % PAGE_SIZE or hi % PAGE_SIZE or hi <= lo:
            raise VmmError(f"bad RAM mapping range {lo:#x}-{hi:#x}")
        self.lo = lo
        self.pages = (hi - lo) // PAGE_SIZE
        self.window_pages = window_pages
        self._base = -1
        self._entries: tuple[int, ...] = ()
        try:
            self._fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise VmmError(f"cannot read the page map of QEMU {pid}: {err}") from err

    def written(self, offset: int) -> bool:
        """True if the page at byte ``offset`` of the mapping is the process's own copy."""
        page = offset // PAGE_SIZE
        if not 0 <= page < self.pages:
            raise VmmError(f"offset {offset:#x} is outside the RAM mapping")
        base = page - page % self.window_pages
        if base != self._base:
            self._load(base)
        entry = self._entries[page - base]
        return bool(entry & SWAPPED or (entry & PRESENT and not entry & FILE_PAGE))

    def invalidate(self) -> None:
        """Forget the cached window: the next question reads the page map again."""
        self._base = -1

    def count(self) -> int:
        """How many pages of the mapping are written right now (a full pass over the page map)."""
        total = 0
        for base in range(0, self.pages, self.window_pages):
            self._load(base)
            total += sum(1 for e in self._entries if e & SWAPPED or (e & PRESENT and not e & FILE_PAGE))
        return total

    def _load(self, base: int) -> None:
        n = min(self.window_pages, self.pages - base)
        position = (self.lo // PAGE_SIZE + base) * 8
        try:
            raw = os.pread(self._fd, n * 8, position)
        except OSError as err:
            raise VmmError(f"cannot read the page map: {err}") from err
        if len(raw) != n * 8:
            raise VmmError(f"short read of the page map ({len(raw)} of {n * 8} bytes): did QEMU exit?")
        self._entries = struct.unpack(f"<{n}Q", raw)
        self._base = base

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> WrittenPages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# the top byte of a pagemap entry holds bits 56-63: 0x80 present, 0x40 swapped, 0x20 file page / shared anon
_WRITTEN_TOP = bytes(1 if (b & 0x40) or (b & 0xA0) == 0x80 else 0 for b in range(256))
_RUN = re.compile(rb"\x01+")


def written_runs(pid: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Every run of written pages of the mapping ``[lo, hi)`` as ``(offset, length)`` in bytes, in order.

    Asked of the kernel's ``PAGEMAP_SCAN`` (:mod:`.pagescan`: only the matching ranges come back, and what is
    not mapped costs nothing, so the pause no longer grows with RAM the guest never touched), else read from
    ``pagemap`` (:func:`pagemap_runs`).
    """
    if lo % PAGE_SIZE or hi % PAGE_SIZE or hi <= lo:
        raise VmmError(f"bad RAM mapping range {lo:#x}-{hi:#x}")
    try:
        return anonymous_runs(pid, lo, hi)
    except Unsupported:
        return pagemap_runs(pid, lo, hi)


def pagemap_runs(pid: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """:func:`written_runs` from a ``pagemap`` read of the whole range (8 bytes per page: 4 MiB for 2 GiB of RAM)
    and C-speed byte operations (a slice of each entry's top byte, ``bytes.translate``, a regex over the
    result), without the argument checks: 4–7 ms for a 512 MiB QEMU, where asking :class:`WrittenPages` page by
    page from Python takes a hundred. A large range is read in :data:`READERS` parts at once: the kernel
    fills an entry for every page, mapped or not, and looks at each present one's ``struct page`` (13–17 ms
    for a 2 GiB QEMU on one thread); the parts walk the page tables side by side."""
    pages = (hi - lo) // PAGE_SIZE
    try:
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise VmmError(f"cannot read the page map of QEMU {pid}: {err}") from err
    first = lo // PAGE_SIZE
    try:
        if pages < PARALLEL_PAGES:
            raw = os.pread(fd, pages * 8, first * 8)
        else:
            share = -(-pages // READERS)
            parts = [(first + i, min(share, pages - i)) for i in range(0, pages, share)]
            with ThreadPoolExecutor(len(parts), thread_name_prefix="pagemap") as pool:
                raw = b"".join(pool.map(lambda part: os.pread(fd, part[1] * 8, part[0] * 8), parts))
    finally:
        os.close(fd)
    if len(raw) != pages * 8:
        raise VmmError(f"short page map read for QEMU {pid}: {len(raw)} of {pages * 8} bytes")
    mask = raw[7::8].translate(_WRITTEN_TOP)
    return [(m.start() * PAGE_SIZE, (m.end() - m.start()) * PAGE_SIZE) for m in _RUN.finditer(mask)]
