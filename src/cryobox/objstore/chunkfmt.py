"""The chunked image format: content-addressed chunk objects plus one small index per image.

A memory image (or a sparse rootfs) is cut into fixed-size chunks (4 MiB; the last one may be short). Every
non-zero chunk is an object of its own, named by the sha256 of its bytes, shared by every image that holds it::

    chunks/<first 2 hex digits of the sha256>/<sha256, 64 hex digits>    the chunk's bytes, nothing else
    <prefix>/memory.idx    ChunkIndex.to_bytes(): b"CRYOIDX2" + JSON (sizes, zero bitmap, sha256 of every chunk)

The two-digit fan-out keeps a ``file://`` store's directories small (256 of them, ~40 chunks each per 10,000) and
spreads S3 key prefixes; the full digest is the name, so a chunk is verified by hashing what a GET returned. An
image refers to its chunks only through its index; zero chunks are never stored (a bit in the bitmap).

Zero bitmap: bit ``i`` lives in byte ``i // 8`` at bit position ``i % 8`` (least significant bit first); a set
bit means chunk ``i`` is all zeros. A restore serves such a chunk as zeros without fetching anything.

Format 1 (``CRYOIDX1``: every image's non-zero chunks concatenated in one ``memory.pack``, the index giving pack
offsets) is no longer read: :meth:`ChunkIndex.from_bytes` refuses it with a :class:`StoreError` saying so, and a
host that bakes a template republishes it in this format (``publish.publish_template``).

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

from ..errors import InvalidArgument, StoreError
from ..util.files import data_extents

CHUNK_SIZE = 4 << 20
INDEX_MAGIC = b"CRYOIDX2"
INDEX_VERSION = 2
LEGACY_MAGIC = b"CRYOIDX1"  # format 1: one memory.pack per image, refused
CHUNKS_PREFIX = "chunks"
READ_BLOCK = 4 << 20  # scan_image reads (and zero-checks) in blocks of at most this size
_WINDOW = 2  # chunks in flight per worker, ahead of the consumer
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK_KEY = re.compile(rf"{CHUNKS_PREFIX}/([0-9a-f]{{2}})/([0-9a-f]{{64}})")


def chunk_digest(data: bytes) -> str:
    """The sha256 hex digest the index records for a chunk's bytes (and the chunk object is named by)."""
    return hashlib.sha256(data).hexdigest()


def chunk_key(sha256: str) -> str:
    """The store key of the chunk whose bytes hash to ``sha256``: ``chunks/<sha256[:2]>/<sha256>``."""
    if not _SHA256_HEX.fullmatch(sha256):
        raise InvalidArgument(f"invalid chunk digest {sha256!r}: expected 64 lowercase hex digits")
    return f"{CHUNKS_PREFIX}/{sha256[:2]}/{sha256}"


def digest_of_key(key: str) -> str | None:
    """The sha256 a chunk key names, or ``None`` when ``key`` is not a well-formed chunk key."""
    match = _CHUNK_KEY.fullmatch(key)
    return match[2] if match and match[2].startswith(match[1]) else None


def index_format(blob: bytes) -> int | None:
    """The format an index's bytes are in (1: legacy, refused; 2: current), or ``None`` for neither."""
    if blob.startswith(INDEX_MAGIC):
        return INDEX_VERSION
    return 1 if blob.startswith(LEGACY_MAGIC) else None


@dataclass(frozen=True)
class ChunkIndex:
    """What every chunk of one image must hash to (and so which chunk objects hold it)."""

    image_size: int
    chunk_size: int
    generation: str
    zero: bytes  # bitmap, bit i set = chunk i is all zeros (never stored, never fetched)
    sha256: tuple[str, ...]  # hex per chunk ("" for zero chunks)

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

    def key(self, i: int) -> str:
        """The store key of non-zero chunk ``i`` (what a GET fetches)."""
        if self.is_zero(i):
            raise InvalidArgument(f"chunk {i} is a zero chunk: it is not stored")
        return chunk_key(self.sha256[i])

    def verify(self, i: int, data: bytes) -> bool:
        """True if ``data`` is exactly chunk ``i`` (length and sha256)."""
        if self.is_zero(i):
            return data == bytes(self.chunk_len(i))
        return len(data) == self.chunk_len(i) and chunk_digest(data) == self.sha256[i]

    def digests(self) -> dict[str, list[int]]:
        """Every distinct stored chunk: its sha256 -> the chunks of this image that hold it (ascending)."""
        found: dict[str, list[int]] = {}
        for i, sha in enumerate(self.sha256):
            if sha:
                found.setdefault(sha, []).append(i)
        return found

    @property
    def stored_bytes(self) -> int:
        """The bytes of every non-zero chunk (what the image occupies in the store before sharing)."""
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
        }
        return INDEX_MAGIC + json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, b: bytes) -> ChunkIndex:
        """Parse an index; a format-1 one, or anything malformed or inconsistent, raises StoreError."""
        if b.startswith(LEGACY_MAGIC):
            raise StoreError(
                "chunk index in format 1 (one memory.pack per image) is no longer read: the image must be "
                "published again by this version (a host that bakes a template republishes it when it starts)"
            )
        if not b.startswith(INDEX_MAGIC):
            raise StoreError(f"corrupt chunk index: bad magic (expected {INDEX_MAGIC!r})")
        try:
            body = json.loads(b[len(INDEX_MAGIC) :])
            if not isinstance(body, dict) or body.get("version") != INDEX_VERSION:
                raise ValueError(f"unsupported version {body.get('version') if isinstance(body, dict) else None!r}")
            zero = base64.b64decode(_typed(body, "zero", str), validate=True)
            sha = _typed(body, "sha256", list)
            if not all(isinstance(s, str) for s in sha):
                raise ValueError("sha256 must be strings")
            return cls(
                image_size=_typed(body, "image_size", int),
                chunk_size=_typed(body, "chunk_size", int),
                generation=_typed(body, "generation", str),
                zero=zero,
                sha256=tuple(sha),
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
        if len(self.zero) != (count + 7) // 8 or len(self.sha256) != count:
            return f"{count} chunks but {len(self.zero)} bitmap bytes and {len(self.sha256)} digests"
        if count % 8 and self.zero[-1] >> (count % 8):
            return "zero bitmap has bits set past the last chunk"
        lengths: dict[str, int] = {}
        for i in range(count):
            if self.is_zero(i):
                if self.sha256[i] != "":
                    return f"zero chunk {i} has a digest"
                continue
            if not _SHA256_HEX.fullmatch(self.sha256[i]):
                return f"chunk {i} has a malformed sha256 {self.sha256[i]!r}"
            if lengths.setdefault(self.sha256[i], self.chunk_len(i)) != self.chunk_len(i):
                return f"chunk {i} shares its sha256 with a chunk of another length"
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


def scan_image(src: Path, generation: str, chunk_size: int = CHUNK_SIZE, *, workers: int = 2) -> ChunkIndex:
    """The index of the raw image ``src``: which chunks are zero, and the sha256 of every other one.

    Holes (found with ``SEEK_DATA``/``SEEK_HOLE``) are zeros and never read; a chunk whose data reads as all
    zero bytes is a zero chunk too. Chunks are read in blocks of at most 4 MiB and hashed on ``workers``
    threads (hashlib and pread release the GIL), a bounded window ahead. I/O errors raise StoreError.
    """
    if chunk_size <= 0 or workers <= 0:
        raise InvalidArgument(f"invalid chunk_size {chunk_size} / workers {workers}")
    try:
        with open(src, "rb") as fin:
            fd = fin.fileno()
            size = os.fstat(fd).st_size
            count = -(-size // chunk_size)
            zero = bytearray(b"\xff" * (count // 8) + (bytes([(1 << (count % 8)) - 1]) if count % 8 else b""))
            sha = [""] * count
            for i, digest in _scan_chunks(fd, _data_chunks(fd, size, chunk_size), size, chunk_size, workers):
                zero[i >> 3] &= ~(1 << (i & 7)) & 0xFF
                sha[i] = digest
    except OSError as err:
        raise StoreError(f"cannot scan image {src}: {err}") from err
    return ChunkIndex(size, chunk_size, generation, bytes(zero), tuple(sha))


def read_chunk(fd: int, index: ChunkIndex, i: int) -> bytes:
    """Chunk ``i`` of the local image open as ``fd``, only if it still hashes to what ``index`` says."""
    data = os.pread(fd, index.chunk_len(i), i * index.chunk_size)
    if not index.verify(i, data):
        raise StoreError(f"chunk {i} of image {index.generation!r} changed since it was indexed (sha256)")
    return data


def _data_chunks(fd: int, size: int, chunk_size: int) -> Iterator[int]:
    """Indices of the chunks that hold any data extent (the others lie wholly in holes), ascending."""
    last = -1
    for start, end in data_extents(fd, size):
        for i in range(max(start // chunk_size, last + 1), (end - 1) // chunk_size + 1):
            yield i
            last = i


def _scan_chunks(fd: int, chunks: Iterator[int], size: int, chunk_size: int, workers: int) -> Iterator[tuple[int, str]]:
    """``(index, sha256)`` of every non-zero chunk among ``chunks``, in order."""
    zero_block = bytes(min(READ_BLOCK, chunk_size))

    def read(i: int) -> tuple[int, str]:
        start, end = i * chunk_size, min((i + 1) * chunk_size, size)
        digest, nonzero = hashlib.sha256(), False
        for pos in range(start, end, READ_BLOCK):
            want = min(READ_BLOCK, end - pos)
            block = os.pread(fd, want, pos)
            if len(block) != want:
                raise OSError(errno.EIO, f"short read at {pos}: the image changed while being scanned")
            nonzero = nonzero or block != (zero_block if want == len(zero_block) else bytes(want))
            digest.update(block)
        return i, digest.hexdigest() if nonzero else ""

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scan") as pool:
        window: deque[Future[tuple[int, str]]] = deque()
        for i in chunks:
            window.append(pool.submit(read, i))
            if len(window) > _WINDOW * workers:
                yield from _nonzero(window.popleft().result())
        while window:
            yield from _nonzero(window.popleft().result())


def _nonzero(result: tuple[int, str]) -> Iterator[tuple[int, str]]:
    if result[1]:
        yield result


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
