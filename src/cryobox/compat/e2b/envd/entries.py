"""The guest's file entries and watch events as envd's ``EntryInfo`` / ``FilesystemEvent``.

A guest entry is a dict with ``name, path, type ("file"|"dir"|"symlink"), size, mode, permissions, owner, group,
mtime (epoch seconds), symlink_target``; missing values read as empty (an older guest's ``is_dir`` stands in for
``type``). ``mode`` carries the permission bits as envd's does (``0o777`` at most) and ``permissions`` is Go's
``FileMode.String()`` (``drwxr-xr-x``) unless the guest sent its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from protobuf.wkt import Timestamp

from ....agentapi import models_procs as mp
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


def _str(raw: Mapping[str, object], key: str) -> str:
    value = raw.get(key)
    return value if isinstance(value, str) else ""


def _int(raw: Mapping[str, object], key: str) -> int:
    value = raw.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def entry_type(raw: Mapping[str, object]) -> str:
    kind = raw.get("type")
    if isinstance(kind, str) and kind in FILE_TYPES:
        return kind
    return "dir" if raw.get("is_dir") is True else "file"


def permissions(kind: str, mode: int) -> str:
    """Go's ``FileMode.String()`` for the permission bits (``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``)."""
    bits = "".join(letter if mode & (1 << (8 - i)) else "-" for i, letter in enumerate("rwxrwxrwx"))
    return TYPE_LETTERS.get(kind, "-") + bits


def _mtime(raw: Mapping[str, object]) -> Timestamp | None:
    value = raw.get("mtime")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return Timestamp.from_seconds(float(value))


def entry_info(raw: Mapping[str, object]) -> pb.EntryInfo:
    kind = entry_type(raw)
    mode = _int(raw, "mode") & 0o777
    target = raw.get("symlink_target")
    return pb.EntryInfo(
        name=_str(raw, "name"),
        type=FILE_TYPES[kind],
        path=_str(raw, "path"),
        size=_int(raw, "size"),
        mode=mode,
        permissions=_str(raw, "permissions") or permissions(kind, mode),
        owner=_str(raw, "owner"),
        group=_str(raw, "group"),
        modified_time=_mtime(raw),
        symlink_target=target if isinstance(target, str) else None,
    )


def answer_entry(answer: Mapping[str, object]) -> Mapping[str, object]:
    """The entry in a guest answer: its ``entry`` member, or the answer itself (``stat`` answers the entry)."""
    entry = answer.get("entry")
    if isinstance(entry, Mapping):
        return entry
    return answer


def answer_entries(answer: Mapping[str, object]) -> list[pb.EntryInfo]:
    entries = answer.get("entries")
    if not isinstance(entries, list):
        raise GuestError("the guest's listing has no entries")
    return [entry_info(e) for e in entries if isinstance(e, Mapping)]


def watch_event(event: mp.FsEvent, entry: pb.EntryInfo | None = None) -> pb.FilesystemEvent | None:
    """A guest change as envd's event (``None`` for ``start``, which is no change)."""
    kind = EVENT_TYPES.get(event.kind)
    if kind is None:
        return None
    return pb.FilesystemEvent(name=event.name, type=kind, entry=entry)
