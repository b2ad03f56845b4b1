"""Settling the pages a short pause staged in memory into a memory layer, at memory speed.

:func:`..vm.devcapture.copy_written` leaves every page the guest wrote in a staging buffer. Each one is one of:

- **equal to the parent's page**: left out, the clone keeps sharing the parent's block;
- **zero** where the parent's is not: a hole is punched (it costs no block);
- **its own**: written into the clone (which unshares just that block) and hashed for the layer's digest.

The comparison runs on whole pieces of the buffer at once (:mod:`numpy`, 512 64-bit words a page: a pass
over 256 MiB takes tens of ms where a Python loop over its 65,536 pages takes seconds). The own pages go to
the file in runs with ``O_DIRECT`` where the volume takes it: straight from the buffer to the disk, without
first faulting in as many page-cache pages (which cost 1.3 µs each on these machines). The changed runs are
hashed for the digest (:func:`.memlayer.chain_digest`, BLAKE3, which releases the GIL while it hashes) by two
threads while it writes.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...util.files import punch_hole
from ..vm.devcapture import Pending
from .memlayer import OWN_MARK, SEGMENT, ZERO_MARK, LayerImage, Run, run_hasher, segments, true_runs

PAGE_SIZE = 4096
WORDS = PAGE_SIZE // 8
HASH_THREADS = 2
ZERO_CHUNK = 1 << 20
WRITERS = 4
WRITE_PIECE = 4 << 20

Runs = list[tuple[int, int, int]]
"""``(offset in the image, position in the buffer, length)``."""


@dataclass
class Classified:
    own: Runs = field(default_factory=list)
    """Runs of pages that are the layer's own."""
    holes: list[tuple[int, int]] = field(default_factory=list)
    """``(offset, length)`` of runs of pages now zero where the parent's are not."""
    same: int = 0
    """Pages equal to the parent's."""
    zero_pages: int = 0
    """Pages now zero (holes or not)."""


def classify(staged: memoryview, pending: Pending, parent_fd: int) -> Classified:
    """Sort the staged pages (see the module doc), reading the parent's bytes from ``parent_fd`` (``pread``: a
    read fault on a tmpfs file's hole through a shared mapping would allocate the page)."""
    out = Classified()
    scratch = np.zeros(max((n for _, _, n in pending), default=0) // 8, dtype=np.uint64)
    for offset, pos, n in pending:
        pages = n // PAGE_SIZE
        new = np.frombuffer(staged, dtype=np.uint64, count=pages * WORDS, offset=pos).reshape(pages, WORDS)
        zero: npt.NDArray[np.bool_] = np.asarray(~new.any(axis=1), dtype=bool)
        if _hole(parent_fd, offset, n):  # the parent's pages here are zeros: what is not zero changed
            changed: npt.NDArray[np.bool_] = ~zero
        else:
            got = os.preadv(parent_fd, [scratch.data.cast("B")[:n]], offset)
            if got < n:
                scratch.view(np.uint8)[got:n] = 0  # past the parent's end: zeros
            old = scratch[: pages * WORDS].reshape(pages, WORDS)
            changed = np.asarray((new != old).any(axis=1), dtype=bool)
        out.same += pages - int(changed.sum())
        out.zero_pages += int(zero.sum())
        for first, last in true_runs(changed & zero):
            out.holes.append((offset + first * PAGE_SIZE, (last - first) * PAGE_SIZE))
        for first, last in true_runs(changed & ~zero):
            out.own.append((offset + first * PAGE_SIZE, pos + first * PAGE_SIZE, (last - first) * PAGE_SIZE))
    out.own = _coalesce(out.own)
    return out


def _hole(fd: int, offset: int, n: int) -> bool:
    """Whether ``[offset, offset + n)`` of the file lies in a hole (guest memory a parent never used mostly does:
    its bytes need not be read to know they are zeros)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) >= offset + n
    except OSError as err:
        return err.errno == errno.ENXIO  # no data after offset at all


def _coalesce(runs: Runs) -> Runs:
    merged: Runs = []
    for offset, pos, n in runs:
        if merged and merged[-1][0] + merged[-1][2] == offset and merged[-1][1] + merged[-1][2] == pos:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + n)
        else:
            merged.append((offset, pos, n))
    return merged


Segment = tuple[int, int, int]
"""``(offset in the image, length, position in the buffer or -1 for zeros)``."""


def changed_runs(found: Classified) -> list[list[Segment]]:
    """The maximal runs of changed pages (own and now-zero ones, which may adjoin) within each 4 MiB segment
    (:data:`.memlayer.SEGMENT`), as their pieces."""
    pieces: list[Segment] = []
    for a, pos, n in found.own:
        pieces += [(at, k, pos + at - a) for at, k in segments(a, n)]
    for a, n in found.holes:
        pieces += [(at, k, -1) for at, k in segments(a, n)]
    runs: list[list[Segment]] = []
    for piece in sorted(pieces):
        if runs and runs[-1][-1][0] + runs[-1][-1][1] == piece[0] and piece[0] % SEGMENT:
            runs[-1].append(piece)
        else:
            runs.append([piece])
    return runs


def _hash_runs(staged: memoryview, runs: list[list[Segment]]) -> list[Run]:
    zeros = bytes(ZERO_CHUNK)
    out: list[Run] = []
    for run in runs:
        h = run_hasher()
        for _, n, pos in run:
            if pos >= 0:
                h.update(staged[pos : pos + n])
            else:
                for done in range(0, n, ZERO_CHUNK):
                    h.update(zeros[: min(ZERO_CHUNK, n - done)])
        out.append((run[0][0], sum(n for _, n, _ in run), h.digest()))
    return out


def _split(runs: list[list[Segment]], parts: int) -> list[list[list[Segment]]]:
    """``runs`` cut into at most ``parts`` consecutive lists of about as many bytes each."""
    total = sum(n for run in runs for _, n, _ in run)
    share = max(1, -(-total // parts))
    out: list[list[list[Segment]]] = [[]]
    size = 0
    for run in runs:
        if size >= share and len(out) < parts:
            out.append([])
            size = 0
        out[-1].append(run)
        size += sum(n for _, n, _ in run)
    return [part for part in out if part]


def write_runs(path: Path, fd: int, staged: memoryview, runs: Runs) -> None:
    """Each run of ``staged`` at its offset of the file: ``O_DIRECT`` where the file system takes it, by
    :data:`WRITERS` threads (a direct write waits for the device; a volume on a loop device takes ~0.1 ms for
    each of the hundreds of short runs a guest leaves), else buffered."""
    pieces = [
        (offset + done, pos + done, min(WRITE_PIECE, n - done))
        for offset, pos, n in runs
        for done in range(0, n, WRITE_PIECE)
    ]
    direct = _open_direct(path)
    if direct < 0:
        for offset, pos, n in pieces:
            os.pwrite(fd, staged[pos : pos + n], offset)
        return
    try:
        with ThreadPoolExecutor(WRITERS, thread_name_prefix="layer-write") as pool:
            done = list(pool.map(lambda piece: _write_direct(direct, staged, piece), pieces))
        refused = [piece for piece, ok in zip(pieces, done, strict=True) if not ok]
        for offset, pos, n in refused:  # (the file system took the open but not the write)
            os.pwrite(fd, staged[pos : pos + n], offset)
    finally:
        os.close(direct)


def _write_direct(direct: int, staged: memoryview, piece: tuple[int, int, int]) -> bool:
    offset, pos, n = piece
    try:
        return os.pwritev(direct, [staged[pos : pos + n]], offset) == n
    except OSError:
        return False


def _open_direct(path: Path) -> int:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC | flag)
    except OSError:
        return -1


def settle_staged(
    sink: LayerImage,
    path: Path,
    buffer: mmap.mmap,
    pending: Pending,
    parent_fd: int,
    steps: dict[str, float] | None = None,
) -> tuple[int, int, list[Run]]:
    """Put the staged ``pending`` pieces of ``buffer`` into the layer ``sink`` (the clone at ``path``), comparing
    them with the parent image's bytes (read from ``parent_fd``); returns ``(pages, zero pages)`` as
    :func:`.memlayer.account_runs` does, and the hashed runs of changed pages (:func:`.memlayer.chain_digest`
    names the layer by them when these were all its pages)."""
    laps = Laps(steps if steps is not None else {})
    runs: list[Run] = []
    with memoryview(buffer) as staged:
        found = classify(staged, pending, parent_fd)
        laps.lap("classify")
        with ThreadPoolExecutor(HASH_THREADS + 1, thread_name_prefix="layer-settle") as pool:
            writing = pool.submit(_timed, write_runs, path, sink.fd, staged, found.own)
            hashing = [pool.submit(_hash_runs, staged, part) for part in _split(changed_runs(found), HASH_THREADS)]
            for offset, n in found.holes:
                punch_hole(sink.fd, offset, n)
                sink.changes.pages.update(dict.fromkeys(range(offset, offset + n, PAGE_SIZE), ZERO_MARK))
            for offset, _, n in found.own:
                sink.changes.pages.update(dict.fromkeys(range(offset, offset + n, PAGE_SIZE), OWN_MARK))
            for job in hashing:
                runs.extend(job.result())
            laps.lap("hash")
            laps.steps["write"] = writing.result()
    sink.same_pages += found.same
    pages = sum(n for _, _, n in pending) // PAGE_SIZE
    return pages - found.zero_pages, found.zero_pages, runs


class Laps:
    def __init__(self, steps: dict[str, float]) -> None:
        self.steps = steps
        self.mark = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.steps[name] = round((now - self.mark) * 1000, 2)
        self.mark = now


def _timed(fn: Callable[..., None], *args: Any) -> float:
    started = time.monotonic()
    fn(*args)
    return round((time.monotonic() - started) * 1000, 2)
