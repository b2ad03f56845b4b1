"""The guest's file entries and watch events as envd's ``EntryInfo`` / ``FilesystemEvent``.

A guest entry (:class:`~cryobox.agentapi.models_guest.FsEntry`) has ``name, path, type ("file"|"dir"|"symlink"),
size, mode, permissions, owner, group, mtime (epoch seconds), symlink_target``; missing values read as empty (an
older guest's ``is_dir`` stands in for ``type``). ``mode`` carries the permission bits as envd's does (``0o777``
at most) and ``permissions`` is Go's ``FileMode.String()`` (``drwxr-xr-x``) unless the guest sent its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from protobuf.wkt import Timestamp

from ....agentapi import models_procs as mp
from ....agentapi.models_guest import FsEntry, FsReply
from ....errors import GuestError
from .gen.filesystem import filesystem_pb as pb

FILE_TYPES: Mapping[str, pb.FileType] = {
    "file": pb.FileType.FILE,
    "dir": pb.FileType.DIRECTORY,
    "symlink": pb.FileType.SYMLINK,
}
TYPE_LETTERS: Mapping[str, str] = {"file": "-", "dir": "d", "symlink": "L"}
EVENT_TYPES: Mapping[str, pb.EventType] = {
    "create": pb.EventType.CREATE,
    "write": pb.EventType.WRITE,
    "remove": pb.EventType.REMOVE,
    "rename": pb.EventType.RENAME,
    "chmod": pb.EventType.CHMOD,
}


def entry_type(entry: FsEntry) -> str:
    if entry.type in FILE_TYPES:
        return entry.type
    return "dir" if entry.is_dir else "file"


def permissions(kind: str, mode: int) -> str:
    """Go's ``FileMode.String()`` for the permission bits (``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``)."""
    bits = "".join(letter if mode & (1 << (8 - i)) else "-" for i, letter in enumerate("rwxrwxrwx"))
    return TYPE_LETTERS.get(kind, "-") + bits


def _mtime(entry: FsEntry) -> Timestamp | None:
    if entry.mtime is None or not math.isfinite(entry.mtime):
        return None
    return Timestamp.from_seconds(entry.mtime)


def entry_info(entry: FsEntry) -> pb.EntryInfo:
    kind = entry_type(entry)
    mode = entry.mode & 0o777
    return pb.EntryInfo(
        name=entry.name,
        type=FILE_TYPES[kind],
        path=entry.path,
        size=entry.size,
        mode=mode,
        permissions=entry.permissions or permissions(kind, mode),
        owner=entry.owner,
        group=entry.group,
        modified_time=_mtime(entry),
        symlink_target=entry.symlink_target,
    )


def answer_entry(answer: FsReply) -> FsEntry:
    """The entry in a guest answer: its ``entry`` member, or the answer itself (``stat`` answers the entry)."""
    return answer.entry if answer.entry is not None else answer


def answer_entries(answer: FsReply) -> list[pb.EntryInfo]:
    if answer.entries is None:
        raise GuestError("the guest's listing has no entries")
    return [entry_info(e) for e in answer.entries]


def watch_event(event: mp.FsEvent, entry: pb.EntryInfo | None = None) -> pb.FilesystemEvent | None:
    """A guest change as envd's event (``None`` for ``start``, which is no change)."""
    kind = EVENT_TYPES.get(event.kind)
    if kind is None:
        return None
    return pb.FilesystemEvent(name=event.name, type=kind, entry=entry)
