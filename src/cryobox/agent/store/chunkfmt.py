"""The chunked memory image format: an index plus a pack of the non-zero chunks.

A memory image is cut into fixed-size chunks (4 MiB; the last one may be short) and uploaded as two objects
under a prefix named by generation::

    <prefix>/memory.idx    ChunkIndex.to_bytes(): b"CRYOIDX1" + JSON (sizes, zero bitmap, sha256 and pack
                           offset of every chunk)
    <prefix>/memory.pack   the non-zero chunks, concatenated in chunk order (zero chunks are never stored)

Zero bitmap: bit ``i`` lives in byte ``i // 8`` at bit position ``i % 8`` (least significant bit first); a set
bit means chunk ``i`` is all zeros. A restore serves such a chunk as zeros without fetching anything.

``PrefetchTrace`` is the chunk order recorded while the image was first read (first-read order, no duplicates);
a restore replays it to warm the cache ahead of the guest.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgument, StoreError
from ...util.files import data_extents

CHUNK_SIZE = 4 << 20
INDEX_MAGIC = b"CRYOIDX1"
INDEX_VERSION = 1
READ_BLOCK = 4 << 20  # pack_image reads (and zero-checks) in blocks of at most this size
_WINDOW = 2  # chunks in flight per worker, ahead of the writer
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def chunk_digest(data: bytes) -> str:
    """The sha256 hex digest the index records for a chunk's bytes."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ChunkIndex:
    """Where every chunk of one memory image is, and what it must hash to."""

    image_size: int
    chunk_size: int
    generation: str
    zero: bytes  # bitmap, bit i set = chunk i is all zeros (never stored, never fetched)
    sha256: tuple[str, ...]  # hex per chunk ("" for zero chunks)
    offsets: tuple[int, ...]  # byte offset of chunk i inside memory.pack (-1 for zero chunks)

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise StoreError(f"invalid chunk index (generation {self.generation!r}): {problem}")

    @property
    def chunk_count(self) -> int:
        return -(-self.image_size // self.chunk_size)

    def is_zero(self, i: int) -> bool:
        self._check_chunk(i)
        return bool(self.zero[i >> 3] >> (i & 7) & 1)

    def chunk_len(self, i: int) -> int:
        """Length of chunk ``i`` (the last chunk may be short)."""
        self._check_chunk(i)
        return min(self.chunk_size, self.image_size - i * self.chunk_size)

    def chunks_for(self, offset: int, size: int) -> range:
        """The chunks holding bytes ``[offset, offset + size)``, clamped at the end of the image."""
        if offset < 0 or size < 0:
            raise InvalidArgument(f"invalid range offset={offset} size={size}")
        end = min(offset + size, self.image_size)
        if offset >= end:
            return range(0)
        return range(offset // self.chunk_size, (end - 1) // self.chunk_size + 1)

    def pack_range(self, i: int) -> tuple[int, int]:
        """``(offset, length)`` of non-zero chunk ``i`` inside memory.pack (what a range GET asks for)."""
        if self.is_zero(i):
            raise InvalidArgument(f"chunk {i} is a zero chunk: it is not stored")
        return self.offsets[i], self.chunk_len(i)

    def verify(self, i: int, data: bytes) -> bool:
        """True if ``data`` is exactly chunk ``i`` (length and sha256)."""
        if self.is_zero(i):
            return data == bytes(self.chunk_len(i))
        return len(data) == self.chunk_len(i) and chunk_digest(data) == self.sha256[i]

    @property
    def stored_bytes(self) -> int:
        """Size of memory.pack: the bytes of every non-zero chunk."""
        return sum(self.chunk_len(i) for i in range(self.chunk_count) if not self.is_zero(i))

    @property
    def zero_chunks(self) -> int:
        return sum(1 for i in range(self.chunk_count) if self.is_zero(i))

    def to_bytes(self) -> bytes:
        body = {
            "version": INDEX_VERSION,
            "image_size": self.image_size,
            "chunk_size": self.chunk_size,
            "generation": self.generation,
            "zero": base64.b64encode(self.zero).decode(),
            "sha256": list(self.sha256),
            "offsets": list(self.offsets),
        }
        return INDEX_MAGIC + json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, b: bytes) -> ChunkIndex:
        """Parse an index; anything malformed or inconsistent raises StoreError."""
        if not b.startswith(INDEX_MAGIC):
            raise StoreError("corrupt chunk index: bad magic (expected b'CRYOIDX1')")
        try:
            body = json.loads(b[len(INDEX_MAGIC) :])
            if not isinstance(body, dict) or body.get("version") != INDEX_VERSION:
                raise ValueError(f"unsupported version {body.get('version') if isinstance(body, dict) else None!r}")
            zero = base64.b64decode(_typed(body, "zero", str), validate=True)
            sha = _typed(body, "sha256", list)
            offsets = _typed(body, "offsets", list)
            if not all(isinstance(s, str) for s in sha) or not all(_is_int(o) for o in offsets):
                raise ValueError("sha256 must be strings and offsets integers")
            return cls(
                image_size=_typed(body, "image_size", int),
                chunk_size=_typed(body, "chunk_size", int),
                generation=_typed(body, "generation", str),
                zero=zero,
                sha256=tuple(sha),
                offsets=tuple(offsets),
            )
        except StoreError as err:
            raise StoreError(f"corrupt chunk index: {err.message}") from err
        except (ValueError, UnicodeDecodeError) as err:  # json.JSONDecodeError and binascii.Error are ValueErrors
            raise StoreError(f"corrupt chunk index: {err}") from err

    def _check_chunk(self, i: int) -> None:
        if not 0 <= i < self.chunk_count:
            raise InvalidArgument(f"chunk {i} out of range (image has {self.chunk_count} chunks)")

    def _problem(self) -> str:
        if not _is_int(self.image_size) or self.image_size < 0:
            return f"bad image_size {self.image_size!r}"
        if not _is_int(self.chunk_size) or self.chunk_size <= 0:
            return f"bad chunk_size {self.chunk_size!r}"
        count = self.chunk_count
        if len(self.zero) != (count + 7) // 8 or len(self.sha256) != count or len(self.offsets) != count:
            sizes = f"{len(self.zero)} bitmap bytes, {len(self.sha256)} digests, {len(self.offsets)} offsets"
            return f"{count} chunks but {sizes}"
        if count % 8 and self.zero[-1] >> (count % 8):
            return "zero bitmap has bits set past the last chunk"
        expect = 0
        for i in range(count):
            if self.is_zero(i):
                if self.sha256[i] != "" or self.offsets[i] != -1:
                    return f"zero chunk {i} has a digest or an offset"
                continue
            if not _SHA256_HEX.fullmatch(self.sha256[i]):
                return f"chunk {i} has a malformed sha256 {self.sha256[i]!r}"
            if self.offsets[i] != expect:
                return f"chunk {i} is at pack offset {self.offsets[i]}, expected {expect}"
            expect += self.chunk_len(i)
        return ""


@dataclass(frozen=True)
class PrefetchTrace:
    """Chunk indices in first-read order, without duplicates."""

    chunks: tuple[int, ...]

    def __post_init__(self) -> None:
        if not all(_is_int(c) and c >= 0 for c in self.chunks) or len(set(self.chunks)) != len(self.chunks):
            raise StoreError("invalid prefetch trace: chunks must be distinct non-negative integers")

    @classmethod
    def from_reads(cls, reads: Iterable[int]) -> PrefetchTrace:
        """The trace of a read sequence: each chunk at its first read."""
        return cls(tuple(dict.fromkeys(reads)))

    def to_bytes(self) -> bytes:
        return json.dumps({"version": 1, "chunks": list(self.chunks)}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, b: bytes) -> PrefetchTrace:
        try:
            body = json.loads(b)
            if not isinstance(body, dict) or body.get("version") != 1:
                raise ValueError("not a version 1 prefetch trace")
            return cls(tuple(_typed(body, "chunks", list)))
        except (ValueError, UnicodeDecodeError) as err:
            raise StoreError(f"corrupt prefetch trace: {err}") from err


def pack_image(src: Path, pack: Path, generation: str, chunk_size: int = CHUNK_SIZE, *, workers: int = 2) -> ChunkIndex:
    """Cut the raw image ``src`` into chunks, write the non-zero ones to ``pack`` and return the index.

    Holes (found with ``SEEK_DATA``/``SEEK_HOLE``) are zeros and never read; a chunk whose data reads as all
    zero bytes is a zero chunk too. Chunks are read in blocks of at most 4 MiB and hashed on ``workers``
    threads (hashlib and pread release the GIL), a bounded window ahead of the writer. ``pack`` is a staging
    file for the upload: it is overwritten and not fsynced. I/O errors raise StoreError.
    """
    if chunk_size <= 0 or workers <= 0:
        raise InvalidArgument(f"invalid chunk_size {chunk_size} / workers {workers}")
    try:
        with open(src, "rb") as fin, open(pack, "wb") as fout:
            fd = fin.fileno()
            size = os.fstat(fd).st_size
            count = -(-size // chunk_size)
            zero = bytearray(b"\xff" * (count // 8) + (bytes([(1 << (count % 8)) - 1]) if count % 8 else b""))
            sha = [""] * count
            offsets = [-1] * count
            written = 0
            for i, blocks, digest in _scan_chunks(fd, _data_chunks(fd, size, chunk_size), size, chunk_size, workers):
                for block in blocks:
                    fout.write(block)
                zero[i >> 3] &= ~(1 << (i & 7)) & 0xFF
                sha[i], offsets[i] = digest, written
                written += min(chunk_size, size - i * chunk_size)
    except OSError as err:
        raise StoreError(f"cannot pack memory image {src} into {pack}: {err}") from err
    return ChunkIndex(size, chunk_size, generation, bytes(zero), tuple(sha), tuple(offsets))


def unpack_image(index: ChunkIndex, pack: Path, dest: Path) -> None:
    """Rebuild the raw (sparse) image from a local memory.pack; every chunk is verified."""
    try:
        with open(pack, "rb") as fin, open(dest, "wb") as fout:
            fout.truncate(index.image_size)
            for i in range(index.chunk_count):
                if index.is_zero(i):
                    continue
                offset, length = index.pack_range(i)
                data = os.pread(fin.fileno(), length, offset)
                if not index.verify(i, data):
                    raise StoreError(
                        f"chunk {i} of generation {index.generation!r} does not match its checksum (sha256)"
                    )
                os.pwrite(fout.fileno(), data, i * index.chunk_size)
    except OSError as err:
        raise StoreError(f"cannot unpack {pack} into {dest}: {err}") from err


def _data_chunks(fd: int, size: int, chunk_size: int) -> Iterator[int]:
    """Indices of the chunks that hold any data extent (the others lie wholly in holes), ascending."""
    last = -1
    for start, end in data_extents(fd, size):
        for i in range(max(start // chunk_size, last + 1), (end - 1) // chunk_size + 1):
            yield i
            last = i


def _scan_chunks(
    fd: int, chunks: Iterator[int], size: int, chunk_size: int, workers: int
) -> Iterator[tuple[int, list[bytes], str]]:
    """``(index, blocks, sha256)`` of every non-zero chunk among ``chunks``, in order."""
    zero_block = bytes(min(READ_BLOCK, chunk_size))

    def read(i: int) -> tuple[int, list[bytes], str]:
        start, end = i * chunk_size, min((i + 1) * chunk_size, size)
        digest, blocks, nonzero = hashlib.sha256(), [], False
        for pos in range(start, end, READ_BLOCK):
            want = min(READ_BLOCK, end - pos)
            block = os.pread(fd, want, pos)
            if len(block) != want:
                raise OSError(errno.EIO, f"short read at {pos}: the image changed while being packed")
            nonzero = nonzero or block != (zero_block if want == len(zero_block) else bytes(want))
            digest.update(block)
            blocks.append(block)
        return i, (blocks if nonzero else []), digest.hexdigest() if nonzero else ""

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pack") as pool:
        window: deque[Future[tuple[int, list[bytes], str]]] = deque()
        for i in chunks:
            window.append(pool.submit(read, i))
            if len(window) > _WINDOW * workers:
                yield from _nonzero(window.popleft().result())
        while window:
            yield from _nonzero(window.popleft().result())


def _nonzero(result: tuple[int, list[bytes], str]) -> Iterator[tuple[int, list[bytes], str]]:
    if result[1]:
        yield result


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
