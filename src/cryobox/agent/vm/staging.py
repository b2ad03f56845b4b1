"""Staging buffers for the short-pause capture, kept warm between captures.

:func:`.devcapture.copy_written` copies the pages a guest wrote into a buffer inside its pause; the buffer must
be faulted in before the pause. Faulting in fresh memory is what costs here: 400 MiB took 167–231 ms in 4 KiB
pages and 253–1,180 ms in transparent huge pages (which need whole 2 MiB blocks, so they come from memory the
machine never touched, which its host backs only then), while memory this process has kept costs nothing
(measured on these machines). So 4 KiB pages, and a buffer is kept for
``keep_s`` after the capture that used it and handed to the next one that fits: a sandbox snapshotted again
and again, or a burst of snapshots, pays for its staging memory once. At most ``max_bytes`` are kept; a
buffer idle for ``keep_s`` is unmapped (a timer on the running loop, or the next :meth:`take`).
"""

from __future__ import annotations

import asyncio
import mmap
import time
from collections.abc import Callable

PAGE_SIZE = 4096
HUGE_PAGE = 2 << 20
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
KEEP_S = 60.0
MAX_KEPT = 512 << 20


def allocate(size: int) -> mmap.mmap:
    """``size`` bytes (rounded up to 2 MiB) of anonymous memory, faulted in now."""
    size += -size % HUGE_PAGE
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buffer.madvise(MADV_POPULATE_WRITE)
    except OSError:  # an older kernel: touch every page
        for pos in range(0, size, PAGE_SIZE):
            buffer[pos] = 0
    return buffer


class StagingPool:
    """Warm staging buffers (see the module doc); one pool per host agent."""

    def __init__(
        self, *, keep_s: float = KEEP_S, max_bytes: int = MAX_KEPT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._idle: list[tuple[float, mmap.mmap]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.allocated = 0
        """Buffers allocated (not reused) so far."""

    @property
    def kept_bytes(self) -> int:
        return sum(len(buffer) for _, buffer in self._idle)

    def take(self, size: int) -> mmap.mmap | None:
        """The smallest kept buffer of at least ``size`` bytes (``None``: :func:`allocate` one). Call it, and
        :meth:`release`, from one thread (the agent's loop)."""
        self.trim()
        fits = [entry for entry in self._idle if len(entry[1]) >= size]
        if not fits:
            self.allocated += 1
            return None
        entry = min(fits, key=lambda e: len(e[1]))
        self._idle.remove(entry)
        return entry[1]

    def release(self, buffer: mmap.mmap) -> None:
        """Keep ``buffer`` for the next capture (the largest ones, up to ``max_bytes``), or unmap it."""
        self._idle.append((self.clock(), buffer))
        self._idle.sort(key=lambda e: -len(e[1]))
        while self._idle and self.kept_bytes > self.max_bytes:
            self._idle.pop()[1].close()
        self._arm()

    def trim(self) -> None:
        """Unmap every buffer idle for ``keep_s`` or longer."""
        now = self.clock()
        for entry in [e for e in self._idle if now - e[0] >= self.keep_s]:
            self._idle.remove(entry)
            entry[1].close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, buffer in self._idle:
            buffer.close()
        self._idle.clear()

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test): the next take trims
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.keep_s, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self.trim()
        if self._idle:
            self._arm()
