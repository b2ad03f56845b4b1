"""Directory watches over inotify (through ctypes on libc; stdlib only).

``watch_dir`` {path, recursive} streams: ``start`` (empty) once the watches are in place, then one ``fs``
event per change, data = JSON ``{"kind", "name"}`` with ``name`` relative to the watched directory
(``sub/file.txt``). Kinds: IN_CREATE and IN_MOVED_TO -> ``create``, IN_MODIFY -> ``write`` (IN_CLOSE_WRITE
is not watched, so a write is reported per write(2) the kernel did not merge, and repeats of the same name
within one read are merged), IN_DELETE -> ``remove``, IN_MOVED_FROM -> ``rename``, IN_ATTRIB -> ``chmod``.
Changes to the watched directory itself other than its removal are not reported. Recursive watches cover
every real subdirectory (not symlinks) and add one for each directory created or moved in later; its
entries found at that moment are reported as ``create`` (so a nested file made right after its directory
is not missed, at the price of an occasional duplicate). It runs until cancelled (final ``{}``) or the
watched directory is removed or moved away (final ``{"ended": "removed"}``).

``watch_create``/``watch_events``/``watch_remove`` keep a watch without a stream: a :class:`WatcherTable`
(one per agent) runs each watcher on its own thread into a bounded buffer that ``watch_events`` drains.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
import select
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .ops_files import OpError, cancel_flag, invalid, optional_bool, require_path

Emit = Callable[[str, bytes], None]
Handler = Callable[[dict[str, Any], Emit], dict[str, Any]]

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
WATCH_MASK = (
    IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
) | (IN_ONLYDIR | IN_EXCL_UNLINK)
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
READ_SIZE = 64 * 1024
POLL_MS = 100  # how often a watch re-checks whether it was cancelled
MAX_EVENTS = 10_000  # per watcher, between two watch_events
MAX_WATCHERS = 64

Change = tuple[str, str]  # kind, name


def log(message: str) -> None:
    print(f"cryobox-guest[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


class DirectoryRemoved(Exception):
    """The watched directory itself was deleted or moved away."""


class DirWatcher:
    """One inotify instance watching ``root`` (and, if ``recursive``, its subdirectories)."""

    def __init__(self, root: str, recursive: bool) -> None:
        if not os.path.exists(root):
            raise OpError("not_found", f"{root} does not exist")
        if not os.path.isdir(root):
            raise OpError("not_a_directory", f"{root} is not a directory")
        self.root = root
        self.recursive = recursive
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise _os_error("inotify_init1")
        self._paths: dict[int, str] = {}  # watch descriptor -> directory relative to root ("" is root)
        self._root_wd = -1
        self._removed = False  # the root went away; raised once what came before it was returned
        try:
            self._root_wd = self._add(root, "")
            if recursive:
                self._add_tree("", report=None)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _add(self, path: str, rel: str) -> int:
        mask = WATCH_MASK if not rel else WATCH_MASK | IN_DONT_FOLLOW
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask))
        if wd < 0:
            raise _os_error(f"inotify_add_watch {path}")
        self._paths[wd] = rel
        return wd

    def _add_tree(self, rel: str, report: list[Change] | None) -> None:
        """Watch the real subdirectories under ``rel`` (already watched itself); report their entries."""
        pending = [rel]
        while pending:
            current = pending.pop()
            try:
                with os.scandir(os.path.join(self.root, current)) as it:
                    children = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            except OSError:
                continue
            for name, is_dir in children:
                child = f"{current}/{name}" if current else name
                if report is not None:
                    report.append(("create", child))
                if is_dir:
                    try:
                        self._add(os.path.join(self.root, child), child)
                    except OSError as err:  # vanished, a symlink now, or out of watches (ENOSPC): go on
                        if err.errno == errno.ENOSPC:
                            log(f"watch of {self.root}: no inotify watch left for {child}")
                        continue
                    pending.append(child)

    def _forget_tree(self, rel: str) -> None:
        """Stop watching ``rel`` and everything under it (moved out of the tree: its paths are stale)."""
        prefix = rel + "/"
        for wd, path in list(self._paths.items()):
            if path == rel or path.startswith(prefix):
                self._libc.inotify_rm_watch(self.fd, wd)
                del self._paths[wd]

    def read(self, timeout_ms: int = POLL_MS) -> list[Change]:
        """Changes that arrived within ``timeout_ms``; :class:`DirectoryRemoved` once the root is gone (after
        returning what came before it)."""
        if self._removed:
            raise DirectoryRemoved(self.root)
        ready, _, _ = select.select([self.fd], [], [], timeout_ms / 1000)
        changes: list[Change] = []
        while ready:
            try:
                buf = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                break
            offset = 0
            while offset + EVENT.size <= len(buf):
                wd, mask, _cookie, length = EVENT.unpack_from(buf, offset)
                raw = buf[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
                offset += EVENT.size + length
                if self._translate(wd, mask, os.fsdecode(raw), changes):
                    self._removed = True
        if self._removed and not changes:
            raise DirectoryRemoved(self.root)
        return changes

    def _translate(self, wd: int, mask: int, name: str, out: list[Change]) -> bool:
        """Append the changes one inotify event means; True if it says the root is gone."""
        if mask & IN_Q_OVERFLOW:
            log(f"watch of {self.root}: the kernel's event queue overflowed; changes were lost")
            return False
        if wd == self._root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED):
            return True
        base = self._paths.get(wd)
        if mask & IN_IGNORED:
            self._paths.pop(wd, None)
            return False
        if base is None or not name:  # a subdirectory's own events are reported by its parent's watch
            return False
        rel = f"{base}/{name}" if base else name
        is_dir = bool(mask & IN_ISDIR)
        if mask & (IN_CREATE | IN_MOVED_TO):
            out.append(("create", rel))
            if is_dir and self.recursive:
                try:
                    self._add(os.path.join(self.root, rel), rel)
                except OSError:
                    return False  # gone again already
                self._add_tree(rel, out)
        elif mask & IN_MODIFY:
            if not out or out[-1] != ("write", rel):
                out.append(("write", rel))
        elif mask & IN_DELETE:
            out.append(("remove", rel))
        elif mask & IN_MOVED_FROM:
            out.append(("rename", rel))
            if is_dir and self.recursive:
                self._forget_tree(rel)
        elif mask & IN_ATTRIB:
            out.append(("chmod", rel))
        return False


def _os_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def _watch_args(args: dict[str, Any]) -> tuple[str, bool]:
    return require_path(args), optional_bool(args, "recursive", False)


def op_watch_dir(args: dict[str, Any], emit: Emit) -> dict[str, Any]:
    cancelled = cancel_flag(emit)
    watcher = DirWatcher(*_watch_args(args))
    try:
        emit("start", b"")
        while not cancelled.is_set():
            try:
                changes = watcher.read()
            except DirectoryRemoved:
                return {"ended": "removed"}
            for kind, name in changes:
                emit("fs", json.dumps({"kind": kind, "name": name}).encode())
        return {}
    finally:
        watcher.close()


class _Watcher:
    def __init__(self, watcher: DirWatcher) -> None:
        self.watcher = watcher
        self.events: deque[Change] = deque()
        self.dropped = 0
        self.ended: str | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    changes = self.watcher.read()
                except DirectoryRemoved:
                    self.ended = "removed"
                    return
                if changes:
                    with self.lock:
                        self.events.extend(changes)
                        while len(self.events) > MAX_EVENTS:
                            self.events.popleft()
                            self.dropped += 1
        finally:
            self.watcher.close()


class WatcherTable:
    """Watches kept between requests (at most :data:`MAX_WATCHERS`); op methods are handlers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[str, _Watcher] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._watchers)

    def handlers(self) -> dict[str, Handler]:
        return {"watch_create": self.op_create, "watch_events": self.op_events, "watch_remove": self.op_remove}

    def close_all(self) -> None:
        with self._lock:
            watchers = list(self._watchers.values())
            self._watchers.clear()
        for watcher in watchers:
            watcher.stop.set()

    def _get(self, args: dict[str, Any]) -> tuple[str, _Watcher]:
        watcher_id = args.get("watcher")
        if not isinstance(watcher_id, str):
            raise invalid("'watcher' must be a string")
        with self._lock:
            watcher = self._watchers.get(watcher_id)
        if watcher is None:
            raise OpError("not_found", f"no watcher {watcher_id!r}")
        return watcher_id, watcher

    def op_create(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        path, recursive = _watch_args(args)
        with self._lock:
            full = len(self._watchers) >= MAX_WATCHERS
        if full:  # checked before the (possibly long) tree walk, and again after it
            raise invalid(f"at most {MAX_WATCHERS} watchers; remove one first")
        watcher = _Watcher(DirWatcher(path, recursive))
        watcher_id = f"w-{secrets.token_hex(6)}"
        with self._lock:
            full = len(self._watchers) >= MAX_WATCHERS
            if not full:
                self._watchers[watcher_id] = watcher
        if full:
            watcher.watcher.close()
            raise invalid(f"at most {MAX_WATCHERS} watchers; remove one first")
        threading.Thread(target=watcher.run, name=f"cryobox-watch-{watcher_id}", daemon=True).start()
        return {"watcher": watcher_id}

    def op_events(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        _, watcher = self._get(args)
        with watcher.lock:
            events = [{"kind": kind, "name": name} for kind, name in watcher.events]
            watcher.events.clear()
            dropped, watcher.dropped = watcher.dropped, 0
        return {"events": events, "dropped": dropped, "ended": watcher.ended}

    def op_remove(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        watcher_id, watcher = self._get(args)
        with self._lock:
            self._watchers.pop(watcher_id, None)
        watcher.stop.set()
        return {}
