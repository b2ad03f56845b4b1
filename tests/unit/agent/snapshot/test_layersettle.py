"""The fast path of a short-pause capture without a VM: process memory read with ``process_vm_readv``, warm
staging buffers, and staged pages settled into a layer (classified, written, hashed by runs) exactly as the
page-by-page accounting would."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from blake3 import blake3

from cryobox.agent.snapshot import layersettle, layerwrite, memlayer
from cryobox.agent.snapshot.layersettle import changed_runs, classify, settle_staged
from cryobox.agent.snapshot.memlayer import (
    EMPTY_DIGEST,
    AllWritten,
    LayerImage,
    account_runs,
    chain_digest,
    image_digest,
)
from cryobox.agent.snapshot.procmem import RemoteMemory
from cryobox.agent.snapshot.staging import StagingPool
from cryobox.errors import VmmError
from cryobox.util.files import allocated_bytes

PAGE = 4096


def _image(path: Path, pages: dict[int, int], size_pages: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size_pages * PAGE)
        for n, byte in pages.items():
            os.pwrite(fh.fileno(), bytes([byte]) * PAGE, n * PAGE)
    return path


def test_remote_memory_copies_ranges_of_a_process_and_refuses_a_short_one() -> None:
    source = mmap.mmap(-1, 16 * PAGE)
    source[:] = bytes(range(256)) * (16 * PAGE // 256)
    base = ctypes.addressof(ctypes.c_char.from_buffer(source))
    target = bytearray(4 * PAGE)
    with RemoteMemory(os.getpid()) as remote, memoryview(target) as view:
        remote.read(view, [(base + 5 * PAGE, 0, PAGE), (base, PAGE, 3 * PAGE)])
        assert bytes(target[:PAGE]) == source[5 * PAGE : 6 * PAGE]
        assert bytes(target[PAGE:]) == source[: 3 * PAGE]
        remote._call = None  # where process_vm_readv is refused: the same through /proc/<pid>/mem
        target[:] = bytes(len(target))
        remote.read(view, [(base + 2 * PAGE, 0, 4 * PAGE)])
        assert bytes(target) == source[2 * PAGE : 6 * PAGE]
    with RemoteMemory(os.getpid()) as remote, memoryview(target) as view, pytest.raises(VmmError):
        remote.read(view, [(8, 0, PAGE)])  # nothing is mapped at address 8
    source.close()


def test_the_staging_pool_reuses_warm_buffers_and_unmaps_idle_ones() -> None:
    now = [100.0]
    pool = StagingPool(keep_s=60.0, max_bytes=8 << 20, clock=lambda: now[0])
    assert pool.take(1 << 20) is None and pool.allocated == 1
    first = layersettle_alloc(4 << 20)
    pool.release(first)
    assert pool.kept_bytes == 4 << 20
    assert pool.take(5 << 20) is None  # too small for it: allocate (and keep the small one)
    again = pool.take(3 << 20)
    assert again is first and pool.kept_bytes == 0
    pool.release(again)
    big = layersettle_alloc(6 << 20)
    pool.release(big)  # 4 + 6 MiB > 8 MiB kept at most: the smaller goes
    assert pool.kept_bytes == 6 << 20 and first.closed
    now[0] += 59.0
    pool.trim()
    assert pool.kept_bytes == 6 << 20
    now[0] += 1.0
    pool.trim()
    assert pool.kept_bytes == 0 and big.closed
    pool.close()


def layersettle_alloc(size: int) -> mmap.mmap:
    from cryobox.agent.snapshot.staging import allocate

    buffer = allocate(size)
    assert len(buffer) >= size and len(buffer) % (2 << 20) == 0
    return buffer


def _stage(pages: dict[int, bytes], pieces: list[tuple[int, int]]) -> tuple[mmap.mmap, list[tuple[int, int, int]]]:
    """A buffer holding the given written pieces ``(first page, count)``, and their pending entries."""
    buffer = mmap.mmap(-1, 64 * PAGE)
    pending = []
    pos = 0
    for first, count in pieces:
        for n in range(first, first + count):
            buffer[pos + (n - first) * PAGE : pos + (n - first + 1) * PAGE] = pages.get(n, bytes(PAGE))
        pending.append((first * PAGE, pos, count * PAGE))
        pos += count * PAGE
    return buffer, pending


@pytest.mark.parametrize(
    ("direct", "segment"), [(True, 4 << 20), (False, 4 << 20), (True, 4 * PAGE)], ids=["o_direct", "buffered", "cut"]
)
def test_settled_pages_equal_the_page_by_page_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool, segment: int
) -> None:
    if not direct:
        monkeypatch.setattr(layerwrite, "open_direct", lambda path: -1)
    else:  # these runs are a few pages each: written with O_DIRECT only when that floor is lowered
        monkeypatch.setattr(layerwrite, "DIRECT_MIN", PAGE)
    # runs are cut at segment boundaries (4 pages here: 9-12 hashes as 9-11 and 12, 20-21 stays whole)
    monkeypatch.setattr(layersettle, "SEGMENT", segment)
    monkeypatch.setattr(memlayer, "SEGMENT", segment)
    if segment == 4 * PAGE:  # and settled in batches of one segment each (written while the next is classified)
        monkeypatch.setattr(layersettle, "BATCH_BYTES", PAGE)
    size = 32
    parent = _image(tmp_path / "parent", {0: 1, 1: 2, 2: 3, 3: 4, 9: 5, 20: 6}, size)
    # written: 0 changed, 1 same as the parent, 2 zeroed (a hole), 3 changed, 9 zeroed next to 10 new,
    # 11-12 new, 15 zero over a zero parent (same), 20-21 changed / new (another piece)
    now = {0: b"\x09" * PAGE, 1: b"\x02" * PAGE, 3: b"\x08" * PAGE, 10: b"\x0a" * PAGE}
    now |= {11: b"\x0b" * PAGE, 12: b"\x0c" * PAGE, 20: b"\x0d" * PAGE, 21: b"\x0e" * PAGE}
    buffer, pending = _stage(now, [(0, 4), (9, 4), (15, 1), (20, 2)])

    fast, slow = tmp_path / "fast", tmp_path / "slow"
    shutil.copyfile(parent, fast)  # (what the reflink clone gives)
    shutil.copyfile(parent, slow)
    with open(parent, "rb") as p:
        fd = os.open(fast, os.O_RDWR)
        sink = LayerImage(fd, p.fileno(), AllWritten(), "p" * 64)
        with memoryview(buffer) as staged:
            found = classify(staged, pending, p.fileno())
            assert found.same == 2 and found.zero_pages == 3
            assert found.holes == [(2 * PAGE, PAGE), (9 * PAGE, PAGE)]
            # maximal runs of changed pages: page 1 (same) splits 0 from 2-3; 9 (zeroed) joins 10-12
            cut = [12] if segment == 4 * PAGE else []
            assert [run[0][0] // PAGE for run in changed_runs(found)] == [0, 2, 9, *cut, 20]
        steps: dict[str, float] = {}
        pages, zeros, runs = settle_staged(sink, fast, buffer, pending, p.fileno(), steps)
        assert set(steps) == {"classify", "hash", "write"}
        fast_digest = chain_digest("p" * 64, runs)
        assert len(runs) == (5 if segment == 4 * PAGE else 4)
        assert fast_digest == sink.digest()  # the runs hashed from the buffer name the file's bytes
        os.close(fd)

        fd = os.open(slow, os.O_RDWR)
        for offset, pos, n in pending:  # the old way: written into the clone, then accounted page by page
            os.pwrite(fd, buffer[pos : pos + n], offset)
        ref = LayerImage(fd, p.fileno(), AllWritten(), "p" * 64)
        assert account_runs(ref, [(o, n) for o, _, n in pending]) == (pages, zeros) == (8, 3)
        assert ref.digest() == fast_digest
        os.close(fd)
    assert fast.read_bytes() == slow.read_bytes()
    assert (sink.own_pages, sink.same_pages) == (ref.own_pages, ref.same_pages) == (7, 2)
    assert allocated_bytes(fast) <= allocated_bytes(slow)  # the zeroed pages are holes in both
    assert fast_digest != chain_digest("q" * 64, runs)  # another parent, another image
    buffer.close()


def test_batches_hold_whole_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memlayer, "SEGMENT", 4 * PAGE)
    monkeypatch.setattr(layersettle, "SEGMENT", 4 * PAGE)
    pending = [(2 * PAGE, 0, 5 * PAGE), (9 * PAGE, 5 * PAGE, 2 * PAGE)]  # pages 2-6 (crossing 4) and 9-10
    cut = list(layersettle.batches(pending, size=PAGE))
    assert cut == [
        [(2 * PAGE, 0, 2 * PAGE)],
        [(4 * PAGE, 2 * PAGE, 3 * PAGE)],
        [(9 * PAGE, 5 * PAGE, 2 * PAGE)],
    ]
    assert list(layersettle.batches(pending, size=64 * PAGE)) == [
        [(2 * PAGE, 0, 2 * PAGE), (4 * PAGE, 2 * PAGE, 3 * PAGE), (9 * PAGE, 5 * PAGE, 2 * PAGE)]
    ]


def test_a_full_images_digest_hashes_its_runs_of_non_zero_pages(tmp_path: Path) -> None:
    image = _image(tmp_path / "img", {1: 7, 2: 8, 6: 9}, 12)
    expected = chain_digest(
        EMPTY_DIGEST,
        [
            (PAGE, 2 * PAGE, blake3(b"\x07" * PAGE + b"\x08" * PAGE).digest()),
            (6 * PAGE, PAGE, blake3(b"\x09" * PAGE).digest()),
        ],
    )
    assert image_digest(image) == expected
    assert image_digest(image, chunk=PAGE) == expected  # a run crossing read blocks is one run
    assert image_digest(_image(tmp_path / "other", {1: 7, 2: 8, 7: 9}, 12)) != expected


def test_a_run_is_cut_at_each_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memlayer, "SEGMENT", 4 * PAGE)
    image = _image(tmp_path / "img", {3: 7, 4: 8, 5: 9}, 12)  # pages 3 | 4-5: two runs
    parts = [(3 * PAGE, PAGE, b"\x07"), (4 * PAGE, 2 * PAGE, b"\x08\x09")]
    expected = chain_digest(
        EMPTY_DIGEST,
        [(a, n, blake3(b"".join(bytes([c]) * PAGE for c in cs)).digest()) for a, n, cs in parts],
    )
    assert image_digest(image) == expected
    assert memlayer.page_runs([3 * PAGE, 4 * PAGE, 5 * PAGE]) == [(3 * PAGE, PAGE), (4 * PAGE, 2 * PAGE)]


async def test_a_kept_buffer_is_unmapped_by_the_loop_when_idle() -> None:
    import asyncio

    pool = StagingPool(keep_s=0.05)
    buffer = layersettle_alloc(2 << 20)
    pool.release(buffer)  # on a running loop: a timer unmaps it
    assert not buffer.closed
    for _ in range(100):
        if buffer.closed:
            break
        await asyncio.sleep(0.01)
    assert buffer.closed and pool.kept_bytes == 0
    pool.close()


def test_classify_finds_the_same_runs_wherever_the_pages_lie_in_the_buffer(tmp_path: Path) -> None:
    """Pieces staged out of order (not end to end in the buffer) are compared row by row all the same, and a
    run of own pages never joins two pages that are apart in the buffer. A piece over a hole of the parent is
    not read: whatever the scratch held there does not count."""
    parent = _image(tmp_path / "parent", {0: 1, 1: 2, 5: 3}, 16)
    buffer = mmap.mmap(-1, 16 * PAGE)
    # image pages 0-1 at buffer pages 4-5, image pages 2-5 at buffer pages 0-3: 4 zero over zero, 5 zero over a 3
    for buffer_page, byte in [(4, 1), (5, 8), (0, 7), (1, 7), (2, 0), (3, 0)]:
        buffer[buffer_page * PAGE : (buffer_page + 1) * PAGE] = bytes([byte]) * PAGE
    # image pages 8-9 (a hole of the parent) at buffer pages 6-7: 8 stays zero (same), 9 is new
    buffer[7 * PAGE : 8 * PAGE] = b"\x05" * PAGE
    pending = [(0, 4 * PAGE, 2 * PAGE), (2 * PAGE, 0, 4 * PAGE), (8 * PAGE, 6 * PAGE, 2 * PAGE)]
    scratch = bytearray(b"\xff" * (8 * PAGE))  # left over from another batch
    with open(parent, "rb") as p, memoryview(buffer) as staged:
        found = classify(staged, pending, p.fileno(), memoryview(scratch))
    assert found.same == 3 and found.zero_pages == 3  # 0 equals the parent's; 4 and 8 are zero over zero
    assert found.holes == [(5 * PAGE, PAGE)]
    # pages 1-3 are own and follow each other in the image, but 1 lies apart in the buffer: two runs
    assert found.own == [(PAGE, 5 * PAGE, PAGE), (2 * PAGE, 0, 2 * PAGE), (9 * PAGE, 7 * PAGE, PAGE)]
    buffer.close()


def test_classify_looks_past_the_sampled_words(tmp_path: Path) -> None:
    """Pages are first decided by a few words each; one that differs from its parent's, or from zeros, only in
    a word the sample skips is still found, over the parent's data and over its holes, scattered or in a row."""
    sampled = {w * 8 for w in layersettle.SAMPLED}
    skipped = next(b for b in range(8, PAGE, 8) if b not in sampled and b + 8 not in sampled)
    rng = np.random.default_rng(7)
    size = 40
    parent_pages = {n: rng.integers(0, 256, PAGE, dtype=np.uint8).tobytes() for n in range(16)}
    parent = tmp_path / "parent"
    with open(parent, "wb") as fh:
        fh.truncate(size * PAGE)
        for n, data in parent_pages.items():
            os.pwrite(fh.fileno(), data, n * PAGE)

    def poke(data: bytes) -> bytes:
        return data[:skipped] + bytes([data[skipped] ^ 0x40]) + data[skipped + 1 :]

    now: dict[int, bytes] = {}
    for n in range(16):  # over data: even pages equal the parent's, odd ones differ in one skipped byte
        now[n] = parent_pages[n] if n % 2 == 0 else poke(parent_pages[n])
    for n in range(16, 40):  # over holes: zero but for one skipped byte on every third page
        now[n] = poke(bytes(PAGE)) if n % 3 == 0 else bytes(PAGE)
    buffer = mmap.mmap(-1, size * PAGE)
    for n, data in now.items():
        buffer[n * PAGE : (n + 1) * PAGE] = data
    with open(parent, "rb") as p, memoryview(buffer) as staged:
        found = classify(staged, [(0, 0, size * PAGE)], p.fileno())
    own = {o // PAGE + k for o, _, n in found.own for k in range(n // PAGE)}
    assert own == {n for n in range(16) if n % 2} | {n for n in range(16, 40) if n % 3 == 0}
    assert found.holes == [] and found.same == 8 + 16 and found.zero_pages == 16
    buffer.close()
