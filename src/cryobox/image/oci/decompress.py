"""A layer blob to a plain tar file: gzip and zstd are unpacked as they stream, a plain tar is copied.

The unpacked size is counted while it is written, so a decompression bomb stops at its limit (one chunk past it
at most, then the file is gone). The SHA-256 of the tar is its *diff ID*, which an image's config lists for each
layer. Nothing here reads the tar's members: the build VM does that.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from ...errors import ImagePullFailed
from .blobs import CHUNK
from .limits import ByteLimit, too_large
from .mediatypes import Compression, layer_compression

_CORRUPT = (OSError, EOFError, zlib.error, zstandard.ZstdError)
"""What a damaged gzip or zstd stream raises (``gzip.BadGzipFile`` is an ``OSError``)."""


@dataclass(frozen=True)
class Unpacked:
    size: int
    """Bytes of the plain tar."""
    diff_id: str
    """``sha256:`` of the plain tar."""
    compression: Compression


def decompress_layer(src: Path, dest: Path, *, media_type: str, limit: ByteLimit, what: str) -> Unpacked:
    """Unpack the layer blob ``src`` to the plain tar ``dest`` (renamed into place only when complete)."""
    with open(src, "rb") as raw:
        compression = layer_compression(media_type, raw.read(4))
        raw.seek(0)
        tmp = dest.with_name(f".{dest.name}.part")
        hasher = hashlib.sha256()
        size = 0
        try:
            with _reader(raw, compression) as stream, open(tmp, "wb") as out:
                try:
                    for chunk in _chunks(stream):
                        size += len(chunk)
                        if size > limit.allowed:
                            raise too_large(f"{what} unpacks to more than allowed", limit)
                        hasher.update(chunk)
                        out.write(chunk)
                except _CORRUPT as exc:
                    raise ImagePullFailed(f"{what} is not valid {compression} data: {exc}") from exc
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return Unpacked(size=size, diff_id=f"sha256:{hasher.hexdigest()}", compression=compression)


@contextlib.contextmanager
def _reader(raw: BinaryIO, compression: Compression) -> Iterator[BinaryIO]:
    if compression == "gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            yield unzipped  # type: ignore[misc]  # a GzipFile is a binary stream
    elif compression == "zstd":
        # read_across_frames: a layer may be several zstd frames back to back (as gzip members may be)
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False) as reader:
            yield reader
    else:
        yield raw


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


__all__ = ["Unpacked", "decompress_layer"]
