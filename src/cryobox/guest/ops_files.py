"""File-system ops of the guest agent, plus the argument/error helpers every op shares.

Each op takes the request's ``args`` dict and returns its ``result`` dict, or raises :class:`OpError`
(an ``OSError`` escaping an op is mapped to a protocol error code by :func:`error_from_oserror`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from typing import Any

MAX_READ = 64 * 1024 * 1024  # largest file read_file returns (fits a frame once base64-encoded)
DEFAULT_MODE = 0o644

FileOp = Callable[[dict[str, Any]], dict[str, Any]]


class OpError(Exception):
    """An op failed with a stable protocol error code (see ``protocol`` for the list)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_ERRNO_CODES: dict[int, str] = {
    errno.ENOENT: "not_found",
    errno.EISDIR: "is_a_directory",
    errno.ENOTDIR: "not_a_directory",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.EEXIST: "exists",
    errno.ENOTEMPTY: "invalid_argument",
    errno.ENAMETOOLONG: "invalid_argument",
    errno.ELOOP: "invalid_argument",
    errno.EINVAL: "invalid_argument",
}


def error_from_oserror(err: OSError) -> OpError:
    return OpError(_ERRNO_CODES.get(err.errno or 0, "internal"), str(err))


def invalid(message: str) -> OpError:
    return OpError("invalid_argument", message)


def require_path(args: dict[str, Any], key: str = "path") -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{key!r} must be a non-empty string")
    if "\x00" in value:
        raise invalid(f"{key!r} contains a NUL byte")
    if not os.path.isabs(value):
        raise invalid(f"{key!r} must be an absolute path, got {value!r}")
    return value


def optional_bool(args: dict[str, Any], key: str, default: bool) -> bool:
    value = args.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{key!r} must be a boolean")
    return value


def decode_b64(value: Any, key: str) -> bytes:
    if not isinstance(value, str):
        raise invalid(f"{key!r} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise invalid(f"{key!r} is not valid base64: {err}") from err


def b64(data: bytes | bytearray) -> str:
    return base64.b64encode(data).decode("ascii")


def _stat_entry(path: str) -> os.stat_result:
    """``os.stat`` following symlinks, falling back to ``lstat`` for broken or looping links."""
    try:
        return os.stat(path)
    except OSError:
        try:
            return os.lstat(path)
        except OSError:
            pass
        raise


def _describe(name: str, st: os.stat_result) -> dict[str, Any]:
    return {
        "name": name,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }


def op_read_file(args: dict[str, Any]) -> dict[str, Any]:
    path = require_path(args)
    with open(path, "rb") as handle:
        if stat.S_ISDIR(os.fstat(handle.fileno()).st_mode):
            raise OpError("is_a_directory", f"{path} is a directory")
        data = handle.read(MAX_READ + 1)
    if len(data) > MAX_READ:
        raise invalid(f"{path} is larger than {MAX_READ} bytes")
    return {"content": b64(data), "size": len(data)}


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def op_write_file(args: dict[str, Any]) -> dict[str, Any]:
    path = require_path(args)
    data = decode_b64(args.get("content"), "content")
    mode = args.get("mode")
    if mode is None:
        mode = DEFAULT_MODE
    elif isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise invalid("'mode' must be an integer between 0 and 0o7777")
    if os.path.isdir(path):
        raise OpError("is_a_directory", f"{path} is a directory")
    if path.endswith("/"):
        raise invalid(f"{path!r} names a directory, not a file")
    parent, name = os.path.split(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except FileExistsError as err:
        raise OpError("not_a_directory", f"{parent} exists and is not a directory") from err
    fd, tmp = tempfile.mkstemp(prefix=f".{name[:100]}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(parent)
    return {"path": path, "bytes": len(data)}


def op_list_dir(args: dict[str, Any]) -> dict[str, Any]:
    path = require_path(args)
    entries: list[dict[str, Any]] = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                st = _stat_entry(entry.path)
            except OSError:
                continue  # vanished while listing
            entries.append(_describe(entry.name, st))
    entries.sort(key=lambda e: str(e["name"]))
    return {"path": path, "entries": entries}


def op_stat(args: dict[str, Any]) -> dict[str, Any]:
    path = require_path(args)
    st = _stat_entry(path)
    name = os.path.basename(os.path.normpath(path)) or "/"
    return {**_describe(name, st), "path": path}


def op_delete(args: dict[str, Any]) -> dict[str, Any]:
    path = require_path(args)
    recursive = optional_bool(args, "recursive", True)
    if os.path.normpath(path) == "/":
        raise invalid("refusing to delete /")
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
    elif recursive:
        shutil.rmtree(path)
    else:
        os.rmdir(path)
    return {}


def op_mkdir(args: dict[str, Any]) -> dict[str, Any]:
    path = require_path(args)
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError as err:
        raise OpError("exists", f"{path} exists and is not a directory") from err
    return {"path": path}


FILE_OPS: dict[str, FileOp] = {
    "read_file": op_read_file,
    "write_file": op_write_file,
    "list_dir": op_list_dir,
    "stat": op_stat,
    "delete": op_delete,
    "mkdir": op_mkdir,
}
