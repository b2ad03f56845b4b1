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
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ...util.files import punch_hole
from ..vm.devcapture import Pending, ms_since
from .memlayer import OWN_MARK, SEGMENT, ZERO_MARK, LayerImage, Run, run_hasher, segments, true_runs

PAGE_SIZE = 4096
WORDS = PAGE_SIZE // 8
HASH_THREADS = 2
ZERO_CHUNK = 1 << 20
WRITERS = 4
WRITE_PIECE = 4 << 20
BATCH_BYTES = 16 << 20

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
    try:
        with (
            memoryview(buffer) as staged,
            ThreadPoolExecutor(WRITERS, thread_name_prefix="layer-write") as writers,
            ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="layer-hash") as hashers,
        ):
            for batch in batches(pending):
                started = time.monotonic()
                found = classify(staged, batch, parent_fd)
                classifying += time.monotonic() - started
                same, zero_pages = same + found.same, zero_pages + found.zero_pages
                for piece in _pieces(found.own):
                    writes.append(writers.submit(_write_piece, direct, sink.fd, staged, piece))
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


def _write_piece(direct: int, fd: int, staged: memoryview, piece: tuple[int, int, int]) -> bool:
    """One piece at its offset: ``O_DIRECT`` where the file took it, else (or where it refuses) buffered."""
    offset, pos, n = piece
    if direct >= 0 and _write_direct(direct, staged, piece):
        return True
    os.pwrite(fd, staged[pos : pos + n], offset)
    return False
