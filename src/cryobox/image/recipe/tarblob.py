"""Build-context archives in memory: reading a user's upload (:func:`read_context`: a tar, plain or compressed, read
as a stream, never extracted, within :class:`ContextLimits`) and writing the deterministic gzip'd tar of a context
blob (:func:`write_blob`: sorted names, owner 0:0 without names, mode and mtime kept, gzip mtime 0), so the same
files always give the same bytes and so the same SHA-256."""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cryobox.errors import InvalidArgument, PayloadTooLarge


@dataclass(frozen=True)
class ContextLimits:
    """What one uploaded build context may hold (all of it is held in memory while it is split)."""

    max_total_bytes: int = 256 << 20
    """The sum of the regular files' sizes (hard links count again)."""
    max_members: int = 50_000
    max_file_bytes: int = 128 << 20


@dataclass(frozen=True)
class Entry:
    """One member of the context: a regular file (hard links resolved into copies), a directory or a symlink."""

    name: str
    """Relative to the context root, cleaned (no ``./`` prefix, no trailing slash)."""
    kind: str
    """``file``, ``dir`` or ``symlink``."""
    mode: int
    mtime: int
    data: bytes = b""
    linkname: str = ""


def member_name(raw: str) -> str:
    """A member's name relative to the context root; refused if absolute or with a ``..`` component."""
    if raw.startswith("/"):
        raise InvalidArgument(f"build context: member {raw!r} has an absolute name", details={"member": raw})
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument(f"build context: member {raw!r} leaves the context (..)", details={"member": raw})
    return "/".join(parts)


def _too_large(what: str, limit: int, member: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"build context: {what} over the limit of {limit}" + (f" (at {member!r})" if member else ""),
        details={"limit": limit, "what": what, "member": member},
    )


class _Reader:
    def __init__(self, limits: ContextLimits) -> None:
        self.limits = limits
        self.entries: dict[str, Entry] = {}
        self.total = 0

    def count_bytes(self, size: int, name: str) -> None:
        if size > self.limits.max_file_bytes:
            raise _too_large("file_bytes", self.limits.max_file_bytes, name)
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise _too_large("total_bytes", self.limits.max_total_bytes, name)

    def add(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        name = member_name(info.name)
        if not name:
            return
        mode, mtime = info.mode & 0o7777, int(info.mtime)
        if info.isreg():
            self.count_bytes(info.size, name)
            stream = tar.extractfile(info)
            data = stream.read() if stream is not None else b""
            self.entries[name] = Entry(name, "file", mode, mtime, data)
        elif info.isdir():
            self.entries[name] = Entry(name, "dir", mode, mtime)
        elif info.issym():
            self.entries[name] = Entry(name, "symlink", mode, mtime, linkname=info.linkname)
        elif info.islnk():
            target = self.entries.get(member_name(info.linkname))
            if target is None or target.kind != "file":
                raise InvalidArgument(
                    f"build context: hard link {name!r} to {info.linkname!r}, which is not an earlier regular file",
                    details={"member": name},
                )
            self.count_bytes(len(target.data), name)
            self.entries[name] = Entry(name, "file", mode, mtime, target.data)
        else:
            raise InvalidArgument(
                f"build context: {name!r} is a device node or a fifo; only files, directories and links can be copied",
                details={"member": name},
            )


def _read(fileobj: BinaryIO, limits: ContextLimits) -> dict[str, Entry]:
    reader = _Reader(limits)
    members = 0
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for info in tar:
                members += 1
                if members > limits.max_members:
                    raise _too_large("members", limits.max_members, info.name)
                reader.add(tar, info)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise InvalidArgument(
            f"build context: not a readable tar archive (plain or gzip): {exc}", details={"member": ""}
        ) from exc
    return reader.entries


def read_context(source: BinaryIO | Path, limits: ContextLimits) -> dict[str, Entry]:
    """The members of an uploaded context by name (a later member of the same name replaces an earlier one)."""
    if isinstance(source, Path):
        with source.open("rb") as fileobj:
            return _read(fileobj, limits)
    return _read(source, limits)


def write_blob(entries: Iterable[Entry]) -> bytes:
    """The deterministic gzip'd tar of ``entries`` (named as they are, in sorted order)."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in sorted(entries, key=lambda e: e.name):
            info = tarfile.TarInfo(entry.name)
            info.mode, info.mtime = entry.mode, entry.mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry.linkname
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buffer.getvalue()


__all__ = ["ContextLimits", "Entry", "member_name", "read_context", "write_blob"]
