"""Build contexts as a user uploads them: tar archives made in memory from a small description of their members."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    mode: int = 0o644
    mtime: int = 1_700_000_000
    linkname: str = ""
    uid: int = 1000
    uname: str = "someone"


def context_tar(members: list[Member], *, gzipped: bool = False) -> bytes:
    """A tar archive (gzip'd if asked) holding ``members`` in the order given."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type, info.mode, info.mtime, info.linkname = m.kind, m.mode, m.mtime, m.linkname
            info.uid, info.gid, info.uname, info.gname = m.uid, m.uid, m.uname, m.uname
            info.size = len(m.data) if m.kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(m.data) if m.kind == tarfile.REGTYPE else None)
    return gzip.compress(raw.getvalue()) if gzipped else raw.getvalue()


def blob_members(blob: bytes) -> dict[str, tarfile.TarInfo]:
    """The members of a context blob by name (trailing ``/`` of directories dropped)."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {info.name.rstrip("/"): info for info in tar.getmembers()}


def blob_file(blob: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        stream = tar.extractfile(name)
        assert stream is not None
        return stream.read()
