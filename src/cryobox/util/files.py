"""Durable file helpers."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2, sort_keys=True).encode() + b"\n")


def stable_hash(value: Any, length: int = 16) -> str:
    """Hex digest of a JSON-serialisable value, independent of dict ordering."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def tree_hash(root: Path) -> str:
    """Digest of every file's relative path and contents under ``root`` (sorted, skipping caches)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def allocated_bytes(path: Path) -> int:
    """Bytes actually allocated on disk for a file or a whole tree (sparse files count what they hold)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each data extent of the file ``fd`` below ``size`` (holes are skipped unread)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to EOF
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        offset = end


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Deallocate ``[offset, offset + length)`` of the file ``fd`` (it reads as zeros; the size is kept)."""
    fallocate = ctypes.CDLL(None, use_errno=True).fallocate  # the process's own libc (dlopen(NULL) is cheap)
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fallocate(PUNCH_HOLE) failed: {os.strerror(err)}")
