"""Writing a settle's own pages and new holes into a memory layer (a reflink clone on the XFS volume).

Two kinds of writes, because the file system charges them differently (figures: docs/SPECIFICATION.md):

- **long runs** (:data:`DIRECT_MIN` and up) go with ``O_DIRECT`` straight from the staging buffer, in pieces of
  at most :data:`WRITE_PIECE`, by :data:`WRITERS` threads: no page-cache page to fault in;
- **short runs** go through the page cache (an ``O_DIRECT`` write waits for its own copy-on-write remap, which
  dominates a small write), and are written back with one ``fdatasync``; new holes are punched.

And ordered, because XFS serialises them: a buffered write takes the file's I/O lock exclusively, and a punch
also waits for every direct write in flight, while each direct write holds the lock shared until it completes.
Interleaved, a real guest's many short runs stall the long ones. So: short runs written before the first long one
go at once, and are written back (``fdatasync``, which takes no such lock) while the long ones are written; short
runs and holes found after it wait until every long write is done.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ...util.files import punch_hole

WRITERS = 4
WRITE_PIECE = 4 << 20
DIRECT_MIN = 256 << 10
"""Runs at least this big go with ``O_DIRECT`` (see the module doc)."""

Runs = list[tuple[int, int, int]]
"""``(offset in the image, position in the buffer, length)``."""
Holes = list[tuple[int, int]]
"""``(offset, length)``."""


class LayerWriter:
    """The writes of one settle into ``fd`` (the layer at ``path``) from ``staged``, on ``pool``'s threads."""

    def __init__(self, path: Path, fd: int, staged: memoryview, pool: ThreadPoolExecutor) -> None:
        self.fd = fd
        self.staged = staged
        self.pool = pool
        self.direct = open_direct(path)
        self._long: list[Future[bool]] = []
        self._early: list[Future[None]] = []
        self._late: tuple[Runs, Holes] = ([], [])
        self._synced: Future[None] | None = None

    def add(self, own: Runs, holes: Holes) -> None:
        """Write ``own`` runs and punch ``holes`` (now or later: see the module doc)."""
        long = [run for run in own if run[2] >= DIRECT_MIN]
        short = [run for run in own if run[2] < DIRECT_MIN]
        if long and not self._long and self._early:  # what went before is written back meanwhile
            self._synced = self.pool.submit(self._sync_after, list(self._early))
        self._long += [self.pool.submit(self._write_piece, piece) for piece in pieces(long)]
        if self._long:
            self._late[0].extend(short)
            self._late[1].extend(holes)
        elif short or holes:
            self._early.append(self.pool.submit(self._write_short, short, holes))

    def finish(self) -> None:
        """Wait for every write, write what was held back, and make the short ones durable."""
        for job in self._long:
            job.result()
        late = bool(self._late[0] or self._late[1])
        self._write_short(*self._late)
        for early in self._early:
            early.result()
        if self._synced is not None:
            self._synced.result()
        if late or (self._early and self._synced is None):
            os.fdatasync(self.fd)

    def close(self) -> None:
        if self.direct >= 0:
            os.close(self.direct)
            self.direct = -1

    def _sync_after(self, jobs: list[Future[None]]) -> None:
        for job in jobs:
            job.result()
        os.fdatasync(self.fd)

    def _write_short(self, runs: Runs, holes: Holes) -> None:
        for offset, pos, n in runs:
            os.pwrite(self.fd, self.staged[pos : pos + n], offset)
        for offset, n in holes:
            punch_hole(self.fd, offset, n)

    def _write_piece(self, piece: tuple[int, int, int]) -> bool:
        """One piece at its offset: ``O_DIRECT`` where the file took it, else (or where it refuses) buffered."""
        offset, pos, n = piece
        if self.direct >= 0:
            try:
                if os.pwritev(self.direct, [self.staged[pos : pos + n]], offset) == n:
                    return True
            except OSError:
                pass
        os.pwrite(self.fd, self.staged[pos : pos + n], offset)
        return False


def pieces(runs: Runs) -> Runs:
    """``runs`` cut into pieces of at most :data:`WRITE_PIECE` bytes."""
    return [(o + d, p + d, min(WRITE_PIECE, n - d)) for o, p, n in runs for d in range(0, n, WRITE_PIECE)]


def open_direct(path: Path) -> int:
    """``path`` opened for ``O_DIRECT`` writes, or -1 where the file system refuses."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC | flag)
    except OSError:
        return -1


def runs_reach(pending: Runs, size: int = DIRECT_MIN) -> bool:
    """Whether some run of ``pending`` pieces (end to end in the image and in the buffer) is ``size`` bytes or
    more: only then can a settle of them write a long run."""
    length = end = pos_end = 0
    for offset, pos, n in pending:
        length = length + n if offset == end and pos == pos_end else n
        if length >= size:
            return True
        end, pos_end = offset + n, pos + n
    return False
