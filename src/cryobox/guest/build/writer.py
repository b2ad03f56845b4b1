"""Writing into the target root: the primitives the layer extractor, ``COPY`` and the account editor share.

Every function takes a host path that :func:`.paths.resolve_in_root` produced (its existing components are real
directories inside the root). None of them writes through a symbolic link at the final component: a file is
created with ``O_EXCL | O_NOFOLLOW`` after whatever was there is removed, and a text file is replaced by a rename.
"""

from __future__ import annotations

import os
import shutil
import stat
from typing import IO

from .errors import BuildError
from .paths import inside

CHUNK = 1 << 20


def make_parents(root: str, host_path: str, uid: int = 0, gid: int = 0, mode: int = 0o755) -> None:
    """Create the missing directories above ``host_path`` (owned by ``uid:gid``)."""
    make_dirs(root, os.path.dirname(host_path), uid, gid, mode)


def make_dirs(root: str, host_dir: str, uid: int = 0, gid: int = 0, mode: int = 0o755) -> list[str]:
    """Create ``host_dir`` and its missing parents (owned by ``uid:gid``); the directories created, outermost first.

    :raises BuildError: an existing component is not a directory.
    """
    missing: list[str] = []
    current = host_dir
    while not os.path.lexists(current):
        missing.append(current)
        current = os.path.dirname(current)
    existing = os.lstat(current).st_mode
    if not stat.S_ISDIR(existing):
        raise BuildError(f"{inside(root, current)} is not a directory")
    created = list(reversed(missing))
    for path in created:
        os.mkdir(path, 0o700)
        os.chown(path, uid, gid)
        os.chmod(path, mode)
    return created


def clear(host_path: str, keep_dir: bool) -> bool:
    """Remove whatever is at ``host_path`` (a directory with its contents); True if a directory was kept."""
    try:
        mode = os.lstat(host_path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        if keep_dir:
            return True
        shutil.rmtree(host_path)
    else:
        os.unlink(host_path)
    return False


def remove(host_path: str) -> None:
    """Remove ``host_path`` if it exists, a directory with everything in it (symbolic links are not followed)."""
    clear(host_path, keep_dir=False)


def write_file(host_path: str, source: IO[bytes], limit: int) -> int:
    """Create ``host_path`` (it must not exist) with the bytes of ``source``; the count written.

    :raises BuildError: ``source`` holds more than ``limit`` bytes.
    """
    fd = os.open(host_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    written = 0
    try:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > limit:
                raise BuildError(f"more than {limit} bytes for {host_path}")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return written


def set_meta(host_path: str, uid: int, gid: int, mode: int | None, mtime: float | None) -> None:
    """Owner, then mode (after the owner: a chown clears setuid bits), then mtime; a symbolic link keeps its mode."""
    os.chown(host_path, uid, gid, follow_symlinks=False)
    is_link = stat.S_ISLNK(os.lstat(host_path).st_mode)
    if mode is not None and not is_link:
        os.chmod(host_path, mode & 0o7777)
    if mtime is not None:
        os.utime(host_path, (mtime, mtime), follow_symlinks=False)


def replace_text(host_path: str, text: str, mode: int, uid: int = 0, gid: int = 0) -> None:
    """Replace ``host_path`` with a regular file holding ``text`` (a symbolic link there is replaced, not followed)."""
    tmp = os.path.join(os.path.dirname(host_path), f".cryobox-tmp.{os.path.basename(host_path)}")
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode("utf-8", "surrogateescape"))
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode & 0o7777)
    finally:
        os.close(fd)
    if os.path.isdir(host_path) and not os.path.islink(host_path):
        remove(tmp)
        raise BuildError(f"cannot replace directory {host_path} with a file")
    os.replace(tmp, host_path)


__all__ = ["clear", "make_dirs", "make_parents", "remove", "replace_text", "set_meta", "write_file"]
