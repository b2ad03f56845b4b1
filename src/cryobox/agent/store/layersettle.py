"""Settling the pages a short pause staged in memory into a memory layer, at memory speed.

:func:`..vm.devcapture.copy_written` leaves every page the guest wrote in a staging buffer. Each one is one of:

- **equal to the parent's page**: left out, the clone keeps sharing the parent's block;
- **zero** where the parent's is not: a hole is punched (it costs no block);
- **its own**: written into the clone (which unshares just that block) and hashed for the layer's digest.

The comparison runs on a whole batch of pages at once, as rows of :mod:`numpy` arrays (512 64-bit words a
page: a pass over 256 MiB takes tens of ms where a Python loop over its 65,536 pages takes seconds, and a
numpy call per run of a real guest's thousands of short runs ~80 µs each). Runs of 256 KiB or more go to the
file with ``O_DIRECT`` where the volume takes it: straight from the buffer to the disk, without first faulting
in as many page-cache pages (which cost 1.3 µs each on these machines); shorter runs go through the page cache
(an ``O_DIRECT`` write waits for its own copy-on-write remap, ~0.1 ms each). The changed runs are
hashed for the digest (:func:`.memlayer.chain_digest`, BLAKE3, which releases the GIL while it hashes) by two
threads while it writes.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ...util.files import punch_hole
from ..vm.devcapture import Pending, ms_since
from .memlayer import OWN_MARK, SEGMENT, ZERO_MARK, LayerImage, Run, run_hasher, segments

PAGE_SIZE = 4096
WORDS = PAGE_SIZE // 8
HASH_THREADS = 2
ZERO_CHUNK = 1 << 20
WRITERS = 4
WRITE_PIECE = 4 << 20
BATCH_BYTES = 16 << 20
COMPARE_PAGES = 256
DIRECT_MIN = 256 << 10
"""Runs at least this big go with ``O_DIRECT``; shorter ones are written through the page cache, all of a batch
in one job: measured on the volume, 2,000 scattered 4–16 KiB runs took ~230 ms with ``O_DIRECT`` (one
copy-on-write remap waited for per write) and ~120 ms buffered, ``fsync`` included."""

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


def classify(staged: memoryview, pending: Pending, parent_fd: int, scratch: memoryview | None = None) -> Classified:
    """Sort the staged pages (see the module doc), reading the parent's bytes from ``parent_fd`` (``pread``: a
    read fault on a tmpfs file's hole through a shared mapping would allocate the page).

    The whole of ``pending`` is compared at once, page by page as rows of numpy arrays: a guest leaves
    thousands of short runs (a ``code-interpreter`` sandbox ~1,200 in 10 MiB), and a numpy call per run cost
    ~80 µs of Python each. ``scratch`` (at least as many bytes as ``pending``) is where the parent's bytes go;
    reusing one spares faulting in a fresh buffer per batch."""
    out = Classified()
    counts = np.array([n // PAGE_SIZE for _, _, n in pending], dtype=np.int64)
    total = int(counts.sum())
    if not total:
        return out
    within = (np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)) * PAGE_SIZE
    offs = np.repeat(np.array([o for o, _, _ in pending], dtype=np.int64), counts) + within
    poss = np.repeat(np.array([p for _, p, _ in pending], dtype=np.int64), counts) + within
    new = _staged_pages(staged, pending, poss, total)
    need = total * PAGE_SIZE
    old_bytes = scratch if scratch is not None and len(scratch) >= need else memoryview(bytearray(need))
    old_u8 = np.frombuffer(old_bytes, dtype=np.uint8, count=need)
    in_hole = np.zeros(total, dtype=bool)  # rows whose parent page is known to be zero (its bytes not read)
    at = 0
    for offset, _, n in pending:
        if _hole(parent_fd, offset, n):  # one lseek: a guest's fresh pages mostly land in the parent's holes
            in_hole[at // PAGE_SIZE : (at + n) // PAGE_SIZE] = True
        elif (got := os.preadv(parent_fd, [old_bytes[at : at + n]], offset)) < n:  # past the parent's end: zeros
            old_u8[at + got : at + n] = 0
        at += n
    old = old_u8.view(np.uint64).reshape(total, WORDS)
    zero = np.empty(total, dtype=bool)
    changed = np.empty(total, dtype=bool)
    for a in range(0, total, COMPARE_PAGES):  # a MiB at a time: the second pass finds the rows in cache
        b = min(total, a + COMPARE_PAGES)
        np.logical_not(new[a:b].any(axis=1), out=zero[a:b])
        holes = in_hole[a:b]
        if holes.all():  # over zeros, what is not zero changed
            np.logical_not(zero[a:b], out=changed[a:b])
            continue
        np.not_equal(new[a:b], old[a:b]).any(axis=1, out=changed[a:b])
        if holes.any():
            changed[a:b][holes] = ~zero[a:b][holes]
    out.same = total - int(changed.sum())
    out.zero_pages = int(zero.sum())
    apart = np.ones(total, dtype=bool)  # a page that does not continue the one before it, in the image or buffer
    apart[1:] = (offs[1:] != offs[:-1] + PAGE_SIZE) | (poss[1:] != poss[:-1] + PAGE_SIZE)
    for first, last in _mask_runs(changed & zero, apart):
        out.holes.append((int(offs[first]), (last - first) * PAGE_SIZE))
    for first, last in _mask_runs(changed & ~zero, apart):
        out.own.append((int(offs[first]), int(poss[first]), (last - first) * PAGE_SIZE))
    return out


def _staged_pages(
    staged: memoryview, pending: Pending, poss: npt.NDArray[np.int64], total: int
) -> npt.NDArray[np.uint64]:
    """The pending pages as rows: a view where they lie end to end in the buffer (as a capture stages them)."""
    if bool(np.all(np.diff(poss) == PAGE_SIZE)):
        return np.frombuffer(staged, dtype=np.uint64, count=total * WORDS, offset=int(poss[0])).reshape(total, WORDS)
    parts = [np.frombuffer(staged, dtype=np.uint64, count=n // 8, offset=pos) for _, pos, n in pending]
    return np.concatenate(parts).reshape(total, WORDS)


def _mask_runs(mask: npt.NDArray[np.bool_], apart: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """``[first, last)`` of every run of ``True`` in ``mask`` that no ``apart`` page breaks."""
    starts = mask.copy()
    starts[1:] &= apart[1:] | ~mask[:-1]
    ends = mask.copy()
    ends[:-1] &= apart[1:] | ~mask[1:]
    return [(int(a), int(b) + 1) for a, b in zip(np.flatnonzero(starts), np.flatnonzero(ends), strict=True)]


def _hole(fd: int, offset: int, n: int) -> bool:
    """Whether ``[offset, offset + n)`` of the file lies in a hole (guest memory a parent never used mostly does:
    its bytes need not be read to know they are zeros)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) >= offset + n
    except OSError as err:
        return err.errno == errno.ENXIO  # no data after offset at all


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
    names the layer by them when these were all its pages).

    Pipelined by batches (:func:`batches`): a batch's pages are written and hashed while the next one is
    classified. ``steps`` gets ``classify`` (the time spent classifying) and, from the start, when the last hash
    and the last write finished (``hash``, ``write``)."""
    timing = steps if steps is not None else {}
    started_at = time.monotonic()
    runs: list[Run] = []
    same = zero_pages = 0
    classifying = 0.0
    direct = _open_direct(path)
    writes: list[Future[bool]] = []
    hashes: list[Future[list[Run]]] = []
    work = list(batches(pending))
    scratch = mmap.mmap(-1, max((sum(n for _, _, n in batch) for batch in work), default=0) or PAGE_SIZE)
    try:
        with (
            memoryview(scratch) as scratch_view,
            memoryview(buffer) as staged,
            ThreadPoolExecutor(WRITERS, thread_name_prefix="layer-write") as writers,
            ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="layer-hash") as hashers,
        ):
            for batch in work:
                started = time.monotonic()
                found = classify(staged, batch, parent_fd, scratch_view)
                classifying += time.monotonic() - started
                same, zero_pages = same + found.same, zero_pages + found.zero_pages
                big = [run for run in found.own if run[2] >= DIRECT_MIN]
                for piece in _pieces(big):
                    writes.append(writers.submit(_write_piece, direct, sink.fd, staged, piece))
                small = [run for run in found.own if run[2] < DIRECT_MIN]
                if small:
                    writes.append(writers.submit(_write_buffered, sink.fd, staged, small))
                hashes += [hashers.submit(_hash_runs, staged, part) for part in _split(changed_runs(found), 2)]
                for offset, n in found.holes:
                    punch_hole(sink.fd, offset, n)
                    sink.changes.pages.update(dict.fromkeys(range(offset, offset + n, PAGE_SIZE), ZERO_MARK))
                for offset, _, n in found.own:
                    sink.changes.pages.update(dict.fromkeys(range(offset, offset + n, PAGE_SIZE), OWN_MARK))
            for job in hashes:
                runs.extend(job.result())
            timing["hash"] = ms_since(started_at)
            for write in writes:
                write.result()
            timing["write"] = ms_since(started_at)
    finally:
        if direct >= 0:
            os.close(direct)
        scratch.close()
    timing["classify"] = round(classifying * 1000, 2)
    sink.same_pages += same
    pages = sum(n for _, _, n in pending) // PAGE_SIZE
    return pages - zero_pages, zero_pages, runs


def batches(pending: Pending, size: int | None = None) -> Iterator[Pending]:
    """``pending`` cut at every segment boundary and grouped into batches, about ``size`` (:data:`BATCH_BYTES`)
    bytes each, that no run of changed pages crosses."""
    size = BATCH_BYTES if size is None else size
    batch: Pending = []
    held = end = 0
    for offset, pos, n in pending:
        for at, k in segments(offset, n):
            # a run of changed pages ends at a segment boundary and at a gap between written pages
            if held >= size and (at % SEGMENT == 0 or at != end):
                yield batch
                batch, held = [], 0
            batch.append((at, pos + at - offset, k))
            held, end = held + k, at + k
    if batch:
        yield batch


def _pieces(runs: Runs) -> list[tuple[int, int, int]]:
    return [(o + d, p + d, min(WRITE_PIECE, n - d)) for o, p, n in runs for d in range(0, n, WRITE_PIECE)]


def _write_buffered(fd: int, staged: memoryview, runs: Runs) -> bool:
    for offset, pos, n in runs:
        os.pwrite(fd, staged[pos : pos + n], offset)
    return False


def _write_piece(direct: int, fd: int, staged: memoryview, piece: tuple[int, int, int]) -> bool:
    """One piece at its offset: ``O_DIRECT`` where the file took it, else (or where it refuses) buffered."""
    offset, pos, n = piece
    if direct >= 0 and _write_direct(direct, staged, piece):
        return True
    os.pwrite(fd, staged[pos : pos + n], offset)
    return False
