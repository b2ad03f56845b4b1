"""How ``stat``, ``list_dir`` and ``move`` describe a file-system entry, and directory creation as a user.

An entry keeps the original keys (``name``, ``is_dir``, ``size``, ``mode``, ``mtime``: what the entry resolves
to, so a symlink to a directory has ``is_dir`` true) and adds ``path`` (absolute), ``type`` (``file``, ``dir``
or ``symlink``: the entry itself, never following a final symlink; fifos, sockets and devices are ``file``),
``permissions`` (Go's ``os.FileMode.String()`` of the entry itself: ``-rw-r--r--``, ``drwxr-xr-x``,
``Lrwxrwxrwx``, ``dtrwxrwxrwx`` for a sticky directory), ``owner`` and ``group`` (of the entry itself; names,
the numeric id as a string when there is none) and ``symlink_target`` (``os.readlink``; null unless a
symlink). A broken symlink describes the link for every key.

No errors are raised here beyond ``OSError``: the ops turn those into protocol codes.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from typing import Any

# Go's os.FileMode type letters, in Go's order ("dalTLDpSugct?"); a, l, T and ? have no Linux counterpart
_GO_TYPE_LETTERS = "dalTLDpSugct"


def go_mode_string(mode: int) -> str:
    """``os.FileMode(mode).String()`` of Go for a Linux ``st_mode``."""
    fmt = stat.S_IFMT(mode)
    flags = {
        "d": fmt == stat.S_IFDIR,
        "L": fmt == stat.S_IFLNK,
        "D": fmt in (stat.S_IFBLK, stat.S_IFCHR),
        "p": fmt == stat.S_IFIFO,
        "S": fmt == stat.S_IFSOCK,
        "u": bool(mode & stat.S_ISUID),
        "g": bool(mode & stat.S_ISGID),
        "c": fmt == stat.S_IFCHR,
        "t": bool(mode & stat.S_ISVTX),
    }
    letters = "".join(letter for letter in _GO_TYPE_LETTERS if flags.get(letter))
    rwx = "".join(char if mode & (1 << (8 - i)) else "-" for i, char in enumerate("rwxrwxrwx"))
    return (letters or "-") + rwx


class Names:
    """uid/gid -> name lookups, cached for the duration of one op (a listing of thousands of entries)."""

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        self._groups: dict[int, str] = {}

    def user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    def group(self, gid: int) -> str:
        name = self._groups.get(gid)
        if name is None:
            try:
                name = grp.getgrgid(gid).gr_name
            except KeyError:
                name = str(gid)
            self._groups[gid] = name
        return name


def describe(path: str, names: Names | None = None, name: str | None = None) -> dict[str, Any]:
    """The entry at ``path`` (which must be absolute); ``OSError`` if it does not exist."""
    names = names or Names()
    own = os.lstat(path)
    resolved = own
    target: str | None = None
    is_link = stat.S_ISLNK(own.st_mode)
    if is_link:
        target = os.readlink(path)
        try:
            resolved = os.stat(path)
        except OSError:  # broken or looping link: describe the link itself
            pass
    if name is None:
        name = os.path.basename(os.path.normpath(path)) or "/"
    if is_link:
        kind = "symlink"
    elif stat.S_ISDIR(own.st_mode):
        kind = "dir"
    else:
        kind = "file"
    return {
        "name": name,
        "path": path,
        "type": kind,
        "is_dir": stat.S_ISDIR(resolved.st_mode),
        "size": resolved.st_size,
        "mode": stat.S_IMODE(resolved.st_mode),
        "mtime": resolved.st_mtime,
        "permissions": go_mode_string(own.st_mode),
        "owner": names.user(own.st_uid),
        "group": names.group(own.st_gid),
        "symlink_target": target,
    }


def list_tree(root: str, depth: int) -> list[dict[str, Any]]:
    """Entries under ``root`` down to ``depth`` levels (1: its children), sorted by path.

    Only real directories are descended into (never a symlink to one); a subdirectory that cannot be read
    (permissions, vanished) contributes no children. An unreadable ``root`` raises ``OSError``.
    """
    names = Names()
    entries: list[dict[str, Any]] = []
    pending: list[tuple[str, int]] = [(root, 1)]
    while pending:
        directory, level = pending.pop()
        try:
            with os.scandir(directory) as it:
                children = list(it)
        except OSError:
            if directory == root:
                raise
            continue
        for child in children:
            try:
                entry = describe(child.path, names, child.name)
            except OSError:
                continue  # vanished while listing
            entries.append(entry)
            if level < depth and entry["type"] == "dir":
                pending.append((child.path, level + 1))
    entries.sort(key=lambda e: str(e["path"]))
    return entries


def missing_dirs(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist yet, outermost first (what ``makedirs`` will create)."""
    missing: list[str] = []
    current = os.path.normpath(path)
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    missing.reverse()
    return missing


def make_dirs(path: str, owner: pwd.struct_passwd | None = None) -> bool:
    """``os.makedirs(path, exist_ok=True)``; directories it created go to ``owner`` (uid and primary gid).

    Returns whether ``path`` itself was created. ``FileExistsError`` if ``path`` (or an ancestor) exists and is
    not a directory.
    """
    created = missing_dirs(path)
    os.makedirs(path, exist_ok=True)
    if owner is not None:
        for directory in created:
            os.lchown(directory, owner.pw_uid, owner.pw_gid)
    return bool(created) and created[-1] == os.path.normpath(path)
