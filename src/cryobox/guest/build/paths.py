"""Paths inside the target root: resolved as if the target were ``/``, never escaping it.

:func:`resolve_in_root` walks a path one component at a time, following symbolic links *within* the root (an
absolute link target restarts at the root, ``..`` never climbs above it), like ``openat2(RESOLVE_IN_ROOT)`` or Go's
``securejoin``. The answer is a host path under the root whose existing components are real directories, so a
write to it lands inside the target. The driver is the only thing running while it writes (leftover processes of a
``RUN`` are killed before anything else happens), so nothing swaps a component between the check and the use; the
build VM is the backstop either way.
"""

from __future__ import annotations

import os
import stat

from .errors import BuildError

MAX_LINKS = 40
"""Symbolic links followed in one resolution before it fails (the kernel's ELOOP limit)."""


def split(path: str) -> list[str]:
    """The components of ``path`` without empty and ``.`` ones."""
    return [part for part in path.split("/") if part not in ("", ".")]


def resolve_in_root(root: str, path: str, *, follow_final: bool = False) -> str:
    """The host path of ``path`` as seen inside ``root``.

    Every component but the last is resolved through symbolic links within ``root``; the last is too only with
    ``follow_final`` (a write replaces a symbolic link instead of writing through it). Components that do not
    exist are appended as they are (a later ``..`` removes them again).
    """
    if "\0" in path:
        raise BuildError(f"path with a NUL byte: {path!r}")
    root = os.path.abspath(root)
    parts: list[str] = []
    pending = list(reversed(split(path)))
    links = 0
    while pending:
        name = pending.pop()
        if name == "..":
            if parts:
                parts.pop()
            continue
        candidate = os.path.join(root, *parts, name)
        try:
            mode = os.lstat(candidate).st_mode
        except OSError:  # missing, or a parent is not a directory: appended as it is
            parts.append(name)
            continue
        if stat.S_ISLNK(mode) and (pending or follow_final):
            links += 1
            if links > MAX_LINKS:
                raise BuildError(f"too many levels of symbolic links resolving {path!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                parts = []
            pending.extend(reversed(split(target)))
            continue
        parts.append(name)
    return os.path.join(root, *parts)


def inside(root: str, host_path: str) -> str:
    """``host_path`` (under ``root``) as the target sees it, for messages: ``/etc/passwd``."""
    rel = os.path.relpath(host_path, os.path.abspath(root))
    return "/" if rel == "." else "/" + rel


__all__ = ["MAX_LINKS", "inside", "resolve_in_root", "split"]
