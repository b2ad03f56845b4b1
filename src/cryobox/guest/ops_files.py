"""File-system ops of the guest agent, plus the argument/error helpers every op shares.

Each op takes the request's ``args`` dict and returns its ``result`` dict, or raises :class:`OpError`
(an ``OSError`` escaping an op is mapped to a protocol error code by :func:`error_from_oserror`).
Entries (``stat``, ``list_dir``, ``move``) are described by :mod:`.ops_entries`. ``user`` (optional, on
``mkdir``, ``move`` and ``write_file``) names an /etc/passwd user that owns what the op creates.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import pwd
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from .ops_entries import describe, list_tree, make_dirs

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


def lookup_user(args: dict[str, Any], key: str = "user") -> pwd.struct_passwd | None:
    """The /etc/passwd entry named by ``args[key]``; None when absent or null; unknown -> invalid_argument."""
    name = args.get(key)
    if name is None:
        return None
    if not isinstance(name, str) or not name or "\x00" in name:
        raise invalid(f"{key!r} must be a user name or null")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise invalid(f"no user {name!r}") from None


def cancel_flag(emit: Callable[[str, bytes], None]) -> threading.Event:
    """The request's cancel flag (``emit.cancelled`` of the agent's ``StreamEmit``); else one never set."""
    flag = getattr(emit, "cancelled", None)
    return flag if isinstance(flag, threading.Event) else threading.Event()


def _make_parent(parent: str, owner: pwd.struct_passwd | None) -> None:
    try:
        make_dirs(parent, owner)
    except FileExistsError as err:
        raise OpError("not_a_directory", f"{parent} exists and is not a directory") from err
    except NotADirectoryError as err:
        raise OpError("not_a_directory", f"an ancestor of {parent} is not a directory") from err


def op_sync(args: dict[str, Any]) -> dict[str, Any]:
    """Flush every filesystem (``sync(2)``): the bake's last step, with nothing of the image's userland."""
    os.sync()
    return {}


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
    owner = lookup_user(args)
    if os.path.isdir(path):
        raise OpError("is_a_directory", f"{path} is a directory")
    if path.endswith("/"):
        raise invalid(f"{path!r} names a directory, not a file")
    parent, name = os.path.split(path)
    _make_parent(parent, owner)
    fd, tmp = tempfile.mkstemp(prefix=f".{name[:100]}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if owner is not None:
                os.fchown(handle.fileno(), owner.pw_uid, owner.pw_gid)
            os.fchmod(handle.fileno(), mode)  # after the chown, which clears set-id bits
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(parent)
    return {"path": path, "bytes": len(data)}


def op_list_dir(args: dict[str, Any]) -> dict[str, Any]:
    """Entries of ``path``; ``depth`` N (default 1) also lists real subdirectories N-1 levels down."""
    path = require_path(args)
    depth = args.get("depth")
    if depth is None:
        depth = 1
    elif isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise invalid("'depth' must be an integer of at least 1")
    return {"path": path, "entries": list_tree(path, depth)}


def op_stat(args: dict[str, Any]) -> dict[str, Any]:
    return describe(require_path(args))


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
    """``{path, created, entry}``: created is False when the directory already existed; entry as ``stat``'s."""
    path = require_path(args)
    owner = lookup_user(args)
    try:
        created = make_dirs(path, owner)
    except FileExistsError as err:
        raise OpError("exists", f"{path} exists and is not a directory") from err
    return {"path": path, "created": created, "entry": describe(path)}


def op_move(args: dict[str, Any]) -> dict[str, Any]:
    """Rename ``path`` to ``destination`` (creating its parents); reply: the destination's entry.

    Like ``rename(2)``: a file replaces an existing file, a directory an empty directory. Across file systems
    it copies and deletes (then the destination must not exist yet).
    """
    source = require_path(args)
    destination = require_path(args, "destination")
    owner = lookup_user(args)
    os.lstat(source)  # a missing source is not_found before anything is created
    _make_parent(os.path.dirname(os.path.normpath(destination)), owner)
    try:
        os.rename(source, destination)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        if os.path.lexists(destination):
            raise OpError("exists", f"{destination} exists on another file system") from err
        shutil.move(source, destination)
    return describe(destination)


FILE_OPS: dict[str, FileOp] = {
    "sync": op_sync,
    "read_file": op_read_file,
    "write_file": op_write_file,
    "list_dir": op_list_dir,
    "stat": op_stat,
    "delete": op_delete,
    "mkdir": op_mkdir,
    "move": op_move,
}
