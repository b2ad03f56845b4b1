"""The chunked image format: scan_image, chunk keys, ChunkIndex (de)serialisation and PrefetchTrace."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cryobox.errors import InvalidArgument, StoreError
from cryobox.objstore import chunkfmt
from cryobox.objstore.chunkfmt import (
    CHUNK_SIZE,
    INDEX_MAGIC,
    ChunkIndex,
    PrefetchTrace,
    chunk_digest,
    chunk_key,
    digest_of_key,
    index_format,
    read_chunk,
    scan_image,
)

KiB = 1 << 10
MiB = 1 << 20
CS = 64 * KiB  # a small chunk size keeps the layout tests fast


def sparse_image(path: Path, size: int, writes: dict[int, bytes]) -> None:
    """A sparse file of ``size`` bytes with ``writes`` (offset -> data) in it."""
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset, data in writes.items():
            os.pwrite(fh.fileno(), data, offset)


def image_bytes(size: int, writes: dict[int, bytes]) -> bytes:
    """What ``sparse_image(..., size, writes)`` reads back as."""
    expect = bytearray(size)
    for offset, data in writes.items():
        expect[offset : offset + len(data)] = data
    return bytes(expect)


def test_scan_layout_zero_chunks_digests_and_keys(tmp_path: Path) -> None:
    size = 10 * CS + 1000  # 11 chunks, the last one 1000 bytes long
    same = os.urandom(CS)
    writes = {
        0: os.urandom(100),  # chunk 0: a little data at the start
        3 * CS - 50: os.urandom(100),  # straddles chunks 2 and 3
        5 * CS: bytes(CS),  # chunk 5: allocated, but every byte is zero
        7 * CS + 4096: os.urandom(CS - 4096),  # chunk 7: data starting mid-chunk
        8 * CS: same,  # chunks 8 and 9 hold the same bytes: one chunk object
        9 * CS: same,
        10 * CS + 10: os.urandom(990),  # the short last chunk
    }
    sparse_image(tmp_path / "img", size, writes)
    content = image_bytes(size, writes)
    index = scan_image(tmp_path / "img", "gen-1", chunk_size=CS)

    assert (index.image_size, index.chunk_size, index.generation, index.chunk_count) == (size, CS, "gen-1", 11)
    nonzero = [0, 2, 3, 7, 8, 9, 10]
    assert [i for i in range(11) if not index.is_zero(i)] == nonzero
    assert index.zero_chunks == 4
    assert index.chunk_len(10) == 1000 and index.chunk_len(0) == CS
    assert index.stored_bytes == 6 * CS + 1000
    for i in range(11):
        piece = content[i * CS : i * CS + index.chunk_len(i)]
        if i in nonzero:
            assert index.sha256[i] == hashlib.sha256(piece).hexdigest() == chunk_digest(piece)
            assert index.key(i) == f"chunks/{index.sha256[i][:2]}/{index.sha256[i]}" == chunk_key(index.sha256[i])
            assert index.verify(i, piece) and not index.verify(i, piece[:-1] + bytes([piece[-1] ^ 1]))
        else:
            assert index.sha256[i] == ""
            assert index.verify(i, bytes(index.chunk_len(i)))
            with pytest.raises(InvalidArgument):
                index.key(i)
    digests = index.digests()
    assert len(digests) == 6 and digests[chunk_digest(same)] == [8, 9]
    assert sorted(i for where in digests.values() for i in where) == nonzero
    with open(tmp_path / "img", "rb") as fh:
        assert read_chunk(fh.fileno(), index, 7) == content[7 * CS : 8 * CS]
        with open(tmp_path / "img", "r+b") as writer:
            os.pwrite(writer.fileno(), b"changed", 7 * CS)
        with pytest.raises(StoreError, match="changed since it was indexed"):
            read_chunk(fh.fileno(), index, 7)
    assert ChunkIndex.from_bytes(index.to_bytes()) == index


def test_chunk_keys() -> None:
    digest = chunk_digest(b"x")
    assert chunk_key(digest) == f"chunks/{digest[:2]}/{digest}" and digest_of_key(chunk_key(digest)) == digest
    for bad in ("chunks/ab/" + "ab" * 32 + "x", f"chunks/00/{digest}", f"chunk/{digest[:2]}/{digest}", "chunks/ab"):
        assert digest_of_key(bad) is None
    for bad_digest in ("", "A" * 64, "g" * 64, "../x"):
        with pytest.raises(InvalidArgument):
            chunk_key(bad_digest)


def test_scan_worker_counts_agree(tmp_path: Path) -> None:
    size = 40 * CS
    writes = {i * CS + 7: os.urandom(3000) for i in range(0, 40, 3)} | {CS * 20: bytes(CS)}
    sparse_image(tmp_path / "img", size, writes)
    one = scan_image(tmp_path / "img", "g", chunk_size=CS, workers=1)
    four = scan_image(tmp_path / "img", "g", chunk_size=CS, workers=4)
    assert one == four


def test_chunks_larger_than_the_read_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunkfmt, "READ_BLOCK", 16 * KiB)
    writes = {CS + CS // 2: b"x" * 10}  # only the 3rd of the 4 read blocks of chunk 1 holds data
    sparse_image(tmp_path / "img", 3 * CS, writes)
    content = image_bytes(3 * CS, writes)
    index = scan_image(tmp_path / "img", "g", chunk_size=CS)
    assert [index.is_zero(i) for i in range(3)] == [True, False, True]
    assert index.sha256[1] == chunk_digest(content[CS : 2 * CS])


def test_empty_and_fully_sparse_images(tmp_path: Path) -> None:
    sparse_image(tmp_path / "empty", 0, {})
    empty = scan_image(tmp_path / "empty", "g")
    assert (empty.chunk_count, empty.stored_bytes, empty.zero, empty.digests()) == (0, 0, b"", {})
    assert empty.chunks_for(0, 100) == range(0)
    sparse_image(tmp_path / "holes", 9 * CS, {})
    holes = scan_image(tmp_path / "holes", "g", chunk_size=CS)
    assert holes.zero == b"\xff\x01" and holes.stored_bytes == 0
    assert ChunkIndex.from_bytes(holes.to_bytes()) == holes


def test_scan_large_sparse_image_reads_only_data_and_is_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 GiB image holding 24 MiB of data and 8 MiB of written zeros: holes are never read."""
    size = 2 << 30
    writes = {k * 80 * MiB + 123: os.urandom(MiB) for k in range(24)}
    writes |= {k * 80 * MiB + 40 * MiB: bytes(MiB) for k in range(8)}
    sparse_image(tmp_path / "img", size, writes)
    read = []
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        read.append(length)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    started = time.monotonic()
    index = scan_image(tmp_path / "img", "g")
    elapsed = time.monotonic() - started
    monkeypatch.undo()

    assert index.chunk_count == 512
    data_chunks = {(off + n - 1) // CHUNK_SIZE for off, data in writes.items() for n in (1, len(data))}
    assert sum(read) <= len(data_chunks) * CHUNK_SIZE  # at most the chunks with allocated data were read
    stored = [i for i in range(512) if not index.is_zero(i)]
    random_data = {off: data for off, data in writes.items() if any(data)}
    assert stored == sorted({(off + n - 1) // CHUNK_SIZE for off, data in random_data.items() for n in (1, len(data))})
    assert index.stored_bytes == len(stored) * CHUNK_SIZE
    assert elapsed < 5.0, f"scan_image took {elapsed:.2f}s for a 2 GiB sparse image"


def test_scan_errors_are_store_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot scan"):
        scan_image(tmp_path / "missing", "g")
    with pytest.raises(InvalidArgument):
        scan_image(tmp_path / "missing", "g", chunk_size=0)


def make_index(**overrides: object) -> ChunkIndex:
    fields: dict[str, object] = {
        "image_size": 3 * CS - 5,
        "chunk_size": CS,
        "generation": "g7",
        "zero": bytes([0b010]),
        "sha256": ("a" * 64, "", "b" * 64),
    }
    fields.update(overrides)
    return ChunkIndex(**fields)  # type: ignore[arg-type]


def test_index_accessors() -> None:
    index = make_index()
    assert index.chunk_count == 3 and index.stored_bytes == 2 * CS - 5
    assert [index.is_zero(i) for i in range(3)] == [False, True, False]
    assert [index.chunk_len(i) for i in range(3)] == [CS, CS, CS - 5]
    assert index.chunks_for(0, 1) == range(1)
    assert index.chunks_for(CS - 1, 2) == range(2)
    assert index.chunks_for(CS, CS) == range(1, 2)
    assert index.chunks_for(0, 10 * CS) == range(3)  # clamped at EOF
    assert index.chunks_for(3 * CS - 6, 100) == range(2, 3)
    assert index.chunks_for(3 * CS - 5, 100) == range(0) and index.chunks_for(5, 0) == range(0)
    for bad in (-1, 3):
        with pytest.raises(InvalidArgument):
            index.is_zero(bad)
        with pytest.raises(InvalidArgument):
            index.chunk_len(bad)
    with pytest.raises(InvalidArgument):
        index.chunks_for(-1, 5)


def test_index_serialisation_is_magic_plus_json() -> None:
    index = make_index()
    blob = index.to_bytes()
    assert blob.startswith(INDEX_MAGIC)
    body = json.loads(blob[len(INDEX_MAGIC) :])
    assert body["version"] == 2 and base64.b64decode(body["zero"]) == index.zero and "offsets" not in body
    assert ChunkIndex.from_bytes(blob) == index
    assert index_format(blob) == 2 and index_format(b"CRYOIDX1{}") == 1 and index_format(b"junk") is None


def test_an_index_of_the_earlier_format_is_refused_saying_so() -> None:
    """Format 1 (one memory.pack per image, pack offsets in the index) is never read as chunk objects."""
    legacy = {"version": 1, "image_size": CS, "chunk_size": CS, "generation": "g", "zero": "AA=="}
    blob = b"CRYOIDX1" + json.dumps({**legacy, "sha256": ["a" * 64], "offsets": [0]}).encode()
    with pytest.raises(StoreError, match="format 1 .*no longer read.*published again"):
        ChunkIndex.from_bytes(blob)


def _tamper(edit: Callable[[dict[str, object]], object]) -> bytes:
    body = json.loads(make_index().to_bytes()[len(INDEX_MAGIC) :])
    edit(body)
    return INDEX_MAGIC + json.dumps(body).encode()


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"CRYOIDX3{}",
        INDEX_MAGIC + b"{not json",
        INDEX_MAGIC + b"[]",
        INDEX_MAGIC + b"\xff\xfe",
        _tamper(lambda b: b.update(version=1)),
        _tamper(lambda b: b.pop("sha256")),
        _tamper(lambda b: b.update(image_size=True)),
        _tamper(lambda b: b.update(image_size=-1)),
        _tamper(lambda b: b.update(chunk_size=0)),
        _tamper(lambda b: b.update(image_size=4 * CS)),  # 4 chunks, 3 digests
        _tamper(lambda b: b.update(zero="!!!")),
        _tamper(lambda b: b.update(zero=base64.b64encode(bytes([0b1010])).decode())),  # bit past the end
        _tamper(lambda b: b.update(sha256=["a" * 64, "", "B" * 64])),
        _tamper(lambda b: b.update(sha256=["a" * 64, "c" * 64, "b" * 64])),  # zero chunk with a digest
        _tamper(lambda b: b.update(sha256=["a" * 64, "", "a" * 64])),  # one digest, two lengths
        _tamper(lambda b: b.update(sha256=["a" * 64, "", 7])),
    ],
)
def test_corrupt_index_raises_store_error(blob: bytes) -> None:
    with pytest.raises(StoreError, match="chunk index"):
        ChunkIndex.from_bytes(blob)


def test_prefetch_trace() -> None:
    trace = PrefetchTrace.from_reads([5, 2, 5, 9, 2, 0])
    assert trace.chunks == (5, 2, 9, 0)
    assert PrefetchTrace.from_bytes(trace.to_bytes()) == trace
    assert PrefetchTrace.from_bytes(PrefetchTrace(()).to_bytes()).chunks == ()
    for blob in (b"", b"[1,2]", b'{"version":1,"chunks":[1,1]}', b'{"version":1,"chunks":[-1]}', b'{"version":1}'):
        with pytest.raises(StoreError, match="prefetch trace"):
            PrefetchTrace.from_bytes(blob)
