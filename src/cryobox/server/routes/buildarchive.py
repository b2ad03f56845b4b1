"""The ``image_archive`` part of ``POST /v1/templates/build`` (:mod:`.buildform`): a ``docker save`` tar or a tar of
an OCI image layout, staged in a temporary file while it is hashed (its SHA-256 names the blob the agent fetches),
size-checked (413) and recognised by its member names (400 when it is neither kind). The control plane never
unpacks it; the agent reads it (:mod:`cryobox.agent.templates.recipebase`)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from starlette.datastructures import UploadFile

from ...errors import ImagePullFailed, InvalidArgument, PayloadTooLarge
from ...image.oci import archive_kind

FIELD = "image_archive"
CHUNK = 1 << 20


@dataclass(frozen=True)
class StagedArchive:
    """An uploaded archive in a temporary file the request's handler owns (:meth:`discard` it when done)."""

    path: Path
    sha256: str
    size: int

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{FIELD}: the archive of {size} bytes exceeds {limit}", details={"field": FIELD, "limit": limit}
    )


def _copy(source: IO[bytes], limit: int) -> StagedArchive:
    fd, name = tempfile.mkstemp(prefix="cryobox-image-archive-", suffix=".tar")
    path = Path(name)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise too_large(size, limit)
                digest.update(chunk)
                out.write(chunk)
        staged = StagedArchive(path, digest.hexdigest(), size)
        try:
            archive_kind(path)
        except ImagePullFailed as err:
            raise InvalidArgument(f"{FIELD}: {err.message}", details={"field": FIELD}) from None
        return staged
    except BaseException:
        path.unlink(missing_ok=True)
        raise


async def stage_archive(upload: UploadFile, limit: int) -> StagedArchive:
    """The uploaded archive in a temporary file, with its SHA-256.

    :raises PayloadTooLarge: larger than ``limit`` (nothing kept).
    :raises InvalidArgument: not a ``docker save`` tar nor an OCI layout tar (nothing kept)."""
    if upload.size is not None and upload.size > limit:
        raise too_large(upload.size, limit)
    await upload.seek(0)
    return await asyncio.to_thread(_copy, upload.file, limit)


__all__ = ["FIELD", "StagedArchive", "stage_archive", "too_large"]
