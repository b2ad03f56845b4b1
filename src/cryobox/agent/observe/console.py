"""Following a VM's serial console (``console.log`` in its run directory, which QEMU appends to and
:mod:`..vm.consolelog` cuts when it grows) line by line, as a hostile guest may write it.

Each read takes at most ``max_bytes`` of what is new; a guest that wrote more since the last read has the excess
skipped (counted, so the log can say so). A file cut under the reader (shorter than where it was) is read again
from its start. Lines are decoded leniently and cleaned of terminal escapes and control characters; a line with
no end is cut at :data:`MAX_PARTIAL` bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_PARTIAL = 2048
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def clean(raw: bytes) -> str:
    """A console line as text: escapes and control characters (tab aside) removed, trailing space stripped."""
    text = raw.decode("utf-8", errors="replace")
    return _CONTROL.sub("", _ESCAPES.sub("", text)).rstrip()


@dataclass
class ConsoleCursor:
    """Where the reader is in one VM's console file."""

    path: Path
    offset: int | None = None
    """``None``: not read yet (the first read starts at most ``max_bytes`` before the end, skipping nothing)."""
    partial: bytes = b""


@dataclass
class ConsoleRead:
    lines: list[str] = field(default_factory=list)
    skipped: int = 0
    """Bytes the guest wrote that were not read (past ``max_bytes`` since the last read)."""
    restarted: bool = False
    """The file was cut under the reader (it read the new file from its start)."""


def read_new(cursor: ConsoleCursor, max_bytes: int) -> ConsoleRead:
    """The complete lines written since the last read (blocking: call from a thread); moves ``cursor`` on."""
    result = ConsoleRead()
    try:
        with open(cursor.path, "rb") as handle:
            size = handle.seek(0, 2)
            if cursor.offset is None:
                cursor.offset = max(0, size - max_bytes)
            elif size < cursor.offset:
                cursor.offset, cursor.partial, result.restarted = 0, b"", True
            pending = size - cursor.offset
            if pending > max_bytes:
                result.skipped = pending - max_bytes
                cursor.offset, cursor.partial = size - max_bytes, b""
            handle.seek(cursor.offset)
            data = handle.read(min(pending, max_bytes))
    except FileNotFoundError:
        return result
    cursor.offset += len(data)
    *complete, rest = (cursor.partial + data).split(b"\n")
    if len(rest) > MAX_PARTIAL:
        complete.append(rest)
        rest = b""
    cursor.partial = rest
    result.lines = [line for line in (clean(raw) for raw in complete) if line]
    return result
