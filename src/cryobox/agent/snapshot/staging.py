"""Staging buffers for the short-pause capture, kept warm between captures.

:func:`.devstate.copy_written` copies the pages a guest wrote into a buffer inside its pause; the buffer must
be faulted in before the pause. Faulting in fresh memory is what costs, more so in transparent huge pages (which
need whole 2 MiB blocks, so they come from memory the machine never touched, which its host backs only then),
while memory this process has kept costs nothing (figures: docs/SPECIFICATION.md). So 4 KiB pages, and a buffer
is kept for ``keep_s`` after the capture that used it and handed to the next one that fits: a sandbox
snapshotted again and again, or a burst of snapshots, pays for its staging memory once. At most ``max_bytes``
are kept; a buffer idle for ``keep_s`` is unmapped (a timer on the running loop, or the next :meth:`take`).

A **reserve** (``CRYOBOX_STAGING_RESERVE_MIB``, default 512: as much as one capture ever stages) is faulted in
once, in the background after the agent starts (:meth:`StagingPool.warm`), and never unmapped while the agent
runs: so even a sandbox's first snapshot finds a warm buffer (faulting in a fresh one is a large part of a first
snapshot, however many threads do it). The agent reports it as held memory (``Capacity.memory_pooled_mib``),
like its warm pools' QEMUs.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap
import os
import time
from collections.abc import Awaitable, Callable, Mapping

from ...errors import InvalidArgument
from ...util.background import Background

log = logging.getLogger(__name__)

PAGE_SIZE = 4096
HUGE_PAGE = 2 << 20
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
KEEP_S = 60.0
MAX_KEPT = 512 << 20
ENV_RESERVE = "CRYOBOX_STAGING_RESERVE_MIB"
DEFAULT_RESERVE = 512 << 20


def reserve_from_env(env: Mapping[str, str] | None = None) -> int:
    """The staging reserve in bytes (``CRYOBOX_STAGING_RESERVE_MIB``; 0 turns it off)."""
    raw = (os.environ if env is None else env).get(ENV_RESERVE, "").strip()
    if not raw:
        return DEFAULT_RESERVE
    try:
        mib = int(raw)
    except ValueError:
        raise InvalidArgument(f"{ENV_RESERVE} must be an integer (MiB), not {raw!r}") from None
    if mib < 0:
        raise InvalidArgument(f"{ENV_RESERVE} must not be negative, not {mib}")
    return mib << 20


POPULATE_CHUNK = 16 << 20
"""Faulted in per ``madvise`` call (a multiple of the huge page size)."""


def _populate(buffer: mmap.mmap, size: int) -> None:
    """Fault in ``buffer``'s ``size`` bytes with ``madvise(MADV_POPULATE_WRITE)`` through ctypes, which lets go
    of the GIL for the call: ``mmap.madvise`` holds it, and faulting in 512 MiB (~0.25 s here) that way stalled
    the agent's event loop as long (seen at the start of an upgrade's successor, inside its restart window).
    :raises OSError: the kernel has no ``MADV_POPULATE_WRITE`` (before 5.14)."""
    view = ctypes.c_char.from_buffer(buffer)  # the mapping's address; released before the buffer can close
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise  # the process's own libc: dlopen(NULL) is cheap
        base = ctypes.addressof(view)
        for offset in range(0, size, POPULATE_CHUNK):  # the call holds the mmap lock: the loop's own mmap waits
            length = min(POPULATE_CHUNK, size - offset)  # at most one chunk's faults, never the whole reserve's
            if madvise(ctypes.c_void_p(base + offset), ctypes.c_size_t(length), MADV_POPULATE_WRITE) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"madvise(MADV_POPULATE_WRITE): {os.strerror(code)}")
    finally:
        del view


def allocate(size: int) -> mmap.mmap:
    """``size`` bytes (rounded up to 2 MiB) of anonymous memory, faulted in now."""
    size += -size % HUGE_PAGE
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        _populate(buffer, size)
    except OSError:  # an older kernel: touch every page
        for pos in range(0, size, PAGE_SIZE):
            buffer[pos] = 0
    return buffer


class StagingPool:
    """Warm staging buffers (see the module doc); one pool per host agent."""

    def __init__(
        self,
        *,
        keep_s: float = KEEP_S,
        max_bytes: int = MAX_KEPT,
        reserve_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        """Kept at most, the reserve aside."""
        self.reserve_bytes = reserve_bytes
        """The size of the buffer :meth:`warm` faults in and the pool keeps for good."""
        self.clock = clock
        self._idle: list[tuple[float, mmap.mmap]] = []
        self._reserve: mmap.mmap | None = None
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self.allocated = 0
        """Buffers allocated (not reused) so far."""

    async def warm(self, run: Callable[[Callable[[int], mmap.mmap], int], Awaitable[mmap.mmap]] | None = None) -> None:
        """Fault in the reserve (once; ``run(allocate, size)`` runs it off the loop: default a thread) and keep it."""
        if self._reserve is not None or self.reserve_bytes <= 0 or self._closed:
            return
        buffer = await (run or asyncio.to_thread)(allocate, self.reserve_bytes)
        if self._closed or self._reserve is not None:
            buffer.close()
            return
        self._reserve = buffer
        self.release(buffer)

    @property
    def reserved_bytes(self) -> int:
        """Bytes the reserve holds now (0 before :meth:`warm` has faulted it in, or after :meth:`close`)."""
        return len(self._reserve) if self._reserve is not None and not self._closed else 0

    @property
    def kept_bytes(self) -> int:
        """Bytes of the buffers kept now, the reserve (when idle) included."""
        return sum(len(buffer) for _, buffer in self._idle)

    def _over(self) -> bool:
        return sum(len(buffer) for _, buffer in self._idle if buffer is not self._reserve) > self.max_bytes

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
        self._idle.sort(key=lambda e: (e[1] is not self._reserve, -len(e[1])))  # the reserve first: kept
        while self._idle and self._over():
            self._idle.pop()[1].close()
        if self._closed:
            self.close()
            return
        self._arm()

    def trim(self) -> None:
        """Unmap every buffer idle for ``keep_s`` or longer (but the reserve)."""
        now = self.clock()
        for entry in [e for e in self._idle if now - e[0] >= self.keep_s and e[1] is not self._reserve]:
            self._idle.remove(entry)
            entry[1].close()

    def close(self) -> None:
        self._closed = True
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
        if any(buffer is not self._reserve for _, buffer in self._idle):
            self._arm()


def start_warming(pool: StagingPool) -> asyncio.Task[None]:
    """:meth:`StagingPool.warm` in the background, on a lower-priority thread (start-up and creates go first)."""

    async def warm() -> None:
        background = Background(workers=1, name="staging-warm")
        try:
            await pool.warm(background.run)
        except OSError as err:  # no memory for it: captures allocate their buffers as before
            log.warning("no snapshot staging reserve: %s", err)
        finally:
            background.close()

    return asyncio.get_running_loop().create_task(warm(), name="staging-warm")
