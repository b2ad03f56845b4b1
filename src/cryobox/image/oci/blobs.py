"""Blobs written to files as they stream, checked against the digest that names them and against a size limit.

A blob that is too large stops at the limit; one whose bytes hash to anything but its digest is deleted. Either
way no partial file is left where the blob was meant to be.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from ...errors import ImageDigestMismatch
from .limits import ByteLimit, too_large

CHUNK = 1 << 20


def sha256_digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def verify_digest(data: bytes, digest: str, what: str) -> None:
    actual = sha256_digest(data)
    if actual != digest:
        raise mismatch(what, digest, actual)


def mismatch(what: str, expected: str, actual: str) -> ImageDigestMismatch:
    return ImageDigestMismatch(
        f"{what} does not match its digest: expected {expected}, got {actual}",
        details={"expected": expected, "actual": actual},
    )


def write_blob(chunks: Iterable[bytes], dest: Path, digest: str | None, *, limit: ByteLimit, what: str) -> int:
    """Write ``chunks`` to ``dest`` (via a temporary sibling, renamed into place when verified); the size.

    ``digest`` None: a blob nothing names (a legacy ``docker save`` layer, checked by its diff ID instead)."""
    tmp = dest.with_name(f".{dest.name}.part")
    hasher = hashlib.sha256()
    size = 0
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                size += len(chunk)
                if size > limit.allowed:
                    raise too_large(f"{what} is larger than allowed", limit)
                hasher.update(chunk)
                out.write(chunk)
        actual = f"sha256:{hasher.hexdigest()}"
        if digest is not None and actual != digest:
            raise mismatch(what, digest, actual)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return size


def read_chunks(stream: IO[bytes]) -> Iterable[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


def read_bounded(chunks: Iterable[bytes], limit: ByteLimit, what: str) -> bytes:
    """All of ``chunks`` in memory (a manifest or config), refusing more than ``limit`` allows."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit.allowed:
            raise too_large(f"{what} is larger than allowed", limit)
        parts.append(chunk)
    return b"".join(parts)


__all__ = ["CHUNK", "mismatch", "read_bounded", "read_chunks", "sha256_digest", "verify_digest", "write_blob"]
