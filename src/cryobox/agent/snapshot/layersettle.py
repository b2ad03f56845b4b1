"""Settling the pages a short pause staged in memory into a memory layer, at memory speed.

:func:`.devstate.copy_written` leaves every page the guest wrote in a staging buffer. Each one is one of:

- **equal to the parent's page**: left out, the clone keeps sharing the parent's block;
- **zero** where the parent's is not: a hole is punched (it costs no block);
- **its own**: written into the clone (which unshares just that block) and hashed for the layer's digest.

The comparison runs on a whole batch of pages at once, as rows of :mod:`numpy` arrays (512 64-bit words a
page): a Python loop over every page, or a numpy call per run of a real guest's thousands of short runs, would
cost more than the writes; it looks at three words of each page first (:data:`SAMPLED`). The
writes are :class:`.layerwrite.LayerWriter`'s (long runs ``O_DIRECT``, short ones buffered, ordered so XFS does
not serialise them). The changed runs are hashed for the digest (:func:`.memlayer.chain_digest`, BLAKE3, which
releases the GIL while it hashes) by two threads while it writes.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .devstate import Pending, ms_since
from .layerwrite import WRITERS, LayerWriter, Runs, runs_reach
from .memlayer import OWN_MARK, SEGMENT, ZERO_MARK, LayerImage, Run, run_hasher, segments

PAGE_SIZE = 4096
WORDS = PAGE_SIZE // 8
HASH_THREADS = 2
ZERO_CHUNK = 1 << 20
BATCH_BYTES = 16 << 20
COMPARE_PAGES = 256


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
    over_holes: int = 0
    """Pages that lie in a hole of the parent (their parent bytes were not read)."""


def classify(
    staged: memoryview,
    pending: Pending,
    parent_fd: int,
    scratch: memoryview | None = None,
    holes_fd: int | None = None,
) -> Classified:
    """Sort the staged pages (see the module doc), reading the parent's bytes from ``parent_fd`` (``pread``: a
    read fault on a tmpfs file's hole through a shared mapping would allocate the page) where ``holes_fd`` (the
    same image: default ``parent_fd``) has data. The parent's file on the volume is the one to ask: the tmpfs copy
    a VM maps gets a zero page allocated wherever the guest first wrote (its write fault reads the page in, and
    a read of a tmpfs hole through a mapping allocates it), so the first capture of a template's sandbox found
    no hole there and read and compared every page.

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
        if _hole(parent_fd if holes_fd is None else holes_fd, offset, n):  # one lseek: fresh pages mostly are
            in_hole[at // PAGE_SIZE : (at + n) // PAGE_SIZE] = True
        elif (got := os.preadv(parent_fd, [old_bytes[at : at + n]], offset)) < n:  # past the parent's end: zeros
            old_u8[at + got : at + n] = 0
        at += n
    old = old_u8.view(np.uint64).reshape(total, WORDS)
    zero = ~_nonzero_rows(new)
    changed = ~zero  # over a hole (its bytes not read: whatever the scratch holds there), what is not zero changed
    read = np.flatnonzero(~in_hole)
    if read.size:  # the others by their sampled words first, then word by word where those agree
        changed[read] = _differing_rows(new, old, read)
        _decide(changed, np.flatnonzero(~(changed | in_hole)), lambda rows: (new[rows] != old[rows]).any(axis=1))
    out.same = total - int(changed.sum())
    out.zero_pages = int(zero.sum())
    out.over_holes = int(in_hole.sum())
    apart = np.ones(total, dtype=bool)  # a page that does not continue the one before it, in the image or buffer
    apart[1:] = (offs[1:] != offs[:-1] + PAGE_SIZE) | (poss[1:] != poss[:-1] + PAGE_SIZE)
    for first, last in _mask_runs(changed & zero, apart):
        out.holes.append((int(offs[first]), (last - first) * PAGE_SIZE))
    for first, last in _mask_runs(changed & ~zero, apart):
        out.own.append((int(offs[first]), int(poss[first]), (last - first) * PAGE_SIZE))
    return out


SAMPLED = (0, WORDS // 2, WORDS - 1)
"""The words of a page looked at first: a page with any of them non-zero (or differing from the parent's) is
decided by them alone; only the others are compared word by word. A pass over every word of 256 MiB of rows
took 70–145 ms (``any(axis=1)`` at 2–4 GB/s); three words a row, a few ms."""


def _nonzero_rows(rows: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """Per row: any word non-zero."""
    out = np.zeros(len(rows), dtype=bool)
    for w in SAMPLED:
        out |= rows[:, w] != 0
    _decide(out, np.flatnonzero(~out), lambda pick: rows[pick].any(axis=1))
    return out


def _differing_rows(
    new: npt.NDArray[np.uint64], old: npt.NDArray[np.uint64], rows: npt.NDArray[np.intp]
) -> npt.NDArray[np.bool_]:
    """For each of ``rows``: a sampled word differs (rows equal in those still have to be compared whole). Only
    those rows are looked at: in a batch mostly over the parent's holes, a pass over all of them took ~11 ms per
    256 MiB."""
    out = np.zeros(len(rows), dtype=bool)
    for w in SAMPLED:
        out |= new[rows, w] != old[rows, w]
    return out


Pick = slice | npt.NDArray[np.intp]


def _decide(out: npt.NDArray[np.bool_], doubt: npt.NDArray[np.intp], test: Callable[[Pick], Any]) -> None:
    """``out[doubt] = test(doubt)``, a MiB of rows at a time: over the whole span of a block where at least half
    of it is in doubt (a slice is a view), else over the rows picked out (each one a copy)."""
    for at in range(0, len(doubt), COMPARE_PAGES):
        block = doubt[at : at + COMPARE_PAGES]
        lo, hi = int(block[0]), int(block[-1]) + 1
        out[block] = test(slice(lo, hi))[block - lo] if 2 * len(block) >= hi - lo else test(block)


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


def settle_staged(
    sink: LayerImage,
    path: Path,
    buffer: mmap.mmap,
    pending: Pending,
    parent_fd: int,
    steps: dict[str, float] | None = None,
    counts: dict[str, int] | None = None,
) -> tuple[int, int, list[Run]]:
    """Put the staged ``pending`` pieces of ``buffer`` into the layer ``sink`` (the clone at ``path``), comparing
    them with the parent image's bytes (read from ``parent_fd``); returns ``(pages, zero pages)`` as
    :func:`.memlayer.account_runs` does, and the hashed runs of changed pages (:func:`.memlayer.chain_digest`
    names the layer by them when these were all its pages).

    Pipelined by batches (:func:`batches`): a batch's pages are written and hashed while the next one is
    classified; batches that can only hold short runs go first, so their writes are done before any long one
    starts (:mod:`.layerwrite`). ``steps`` gets ``classify`` (the time spent classifying) and, from the start,
    when the last write and the last hash finished (``write``, ``hash``); ``counts`` what it found
    (:func:`count`)."""
    timing = steps if steps is not None else {}
    tally = counts if counts is not None else {}
    started_at = time.monotonic()
    runs: list[Run] = []
    same = zero_pages = 0
    classifying = 0.0
    hashes: list[Future[list[Run]]] = []
    work = sorted(batches(pending), key=runs_reach)
    scratch = mmap.mmap(-1, max((sum(n for _, _, n in batch) for batch in work), default=0) or PAGE_SIZE)
    try:
        with (
            memoryview(scratch) as scratch_view,
            memoryview(buffer) as view,
            ThreadPoolExecutor(WRITERS, thread_name_prefix="layer-write") as writers,
            ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="layer-hash") as hashers,
        ):
            writer = LayerWriter(path, sink.fd, view, writers)
            try:
                for batch in work:
                    started = time.monotonic()
                    found = classify(view, batch, parent_fd, scratch_view, sink.parent_fd)
                    classifying += time.monotonic() - started
                    count(tally, found)
                    same, zero_pages = same + found.same, zero_pages + found.zero_pages
                    writer.add(found.own, found.holes)
                    parts = _split(changed_runs(found), 2)
                    hashes += [hashers.submit(_hash_runs, view, part) for part in parts]
                    sink.changes.runs += [(offset, n, ZERO_MARK) for offset, n in found.holes]
                    sink.changes.runs += [(offset, n, OWN_MARK) for offset, _, n in found.own]
                writer.finish()
                timing["write"] = ms_since(started_at)
                for job in hashes:
                    runs.extend(job.result())
                timing["hash"] = ms_since(started_at)
            finally:
                writer.close()
    finally:
        scratch.close()
    timing["classify"] = round(classifying * 1000, 2)
    sink.same_pages += same
    pages = sum(n for _, _, n in pending) // PAGE_SIZE
    return pages - zero_pages, zero_pages, runs


def count(tally: dict[str, int], found: Classified) -> None:
    """Add what ``found`` holds to ``tally``: pages equal to the parent's (``same``), now zero (``zero``), over a
    hole of the parent (``over_holes``), and the runs of own pages and of new holes (``own_runs``,
    ``hole_runs``: a real guest leaves thousands of short ones, and each costs a write or a punch)."""
    for key, value in (
        ("same", found.same),
        ("zero", found.zero_pages),
        ("over_holes", found.over_holes),
        ("own_runs", len(found.own)),
        ("hole_runs", len(found.holes)),
    ):
        tally[key] = tally.get(key, 0) + value


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
