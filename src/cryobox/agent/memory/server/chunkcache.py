"""The per-host durable chunk cache, shared by every restore of every image and surviving agent restarts.

Layout (content-addressed, like the store's ``chunks/``)::

    <root>/<sha256[:2]>/<sha256>                     one verified chunk (its mtime = last use, see below)
    <root>/<sha256[:2]>/.<sha256>.tmp.<pid>.<rand>   a chunk being written (leftovers removed by open())

A chunk is named by the sha256 of its bytes, so a chunk that one image brought in (a template's restores) is a
hit for every image that holds the same bytes (the template's snapshots, their siblings, later generations).
Other entries of ``<root>`` (``objects/``: the memory server's copies of indexes and traces) are not the cache's.
Directories of the earlier layout (``<root>/<32 hex identity>/<idx>``, chunks keyed by image and position) are
removed by open(): nothing reads them any more.

A chunk becomes present only through ``PutDurable``: write a temporary file in the same directory, fdatasync,
rename it to its final name, fsync the directory, and only then mark it present in the in-memory index. A
process killed at any moment therefore leaves either no chunk or a complete one under the final name (plus,
maybe, a temporary file that the next open() removes). Every read from disk is verified against the sha256 it
is named by; a mismatch deletes the file and reads as a miss.

The budget counts allocated blocks (``st_blocks * 512``) of the chunk files. Eviction is LRU per chunk. Last
use is kept in memory and mirrored into each chunk file's mtime (set when written, refreshed on a hit at most
every ``touch_interval_s``; never fsynced), and open() rebuilds the index and the LRU order from the files.
One process owns a cache root at a time.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ....errors import InvalidArgument, StateError, StoreError
from ....util.files import fsync_dir

_FANOUT = re.compile(r"[0-9a-f]{2}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"\.([0-9a-f]{64})\.tmp\.([0-9]+)\.[0-9a-f]+")
_LEGACY = re.compile(r"[0-9a-f]{32}")  # <root>/<identity>/<idx>: the layout before chunks were content-addressed


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0  # absent, vanished or corrupt
    puts: int = 0
    corrupt: int = 0  # reads whose bytes did not match their sha256 (the file was deleted)
    evictions: int = 0
    evicted_bytes: int = 0


@dataclass
class _Entry:
    size: int  # allocated bytes
    used: float  # last use (clock)
    touched: float  # the file's mtime as last set by us


class ChunkCache:
    """Verified chunks on local disk by sha256, bounded by ``budget_bytes`` of allocated blocks; thread-safe."""

    def __init__(
        self,
        root: Path,
        budget_bytes: int,
        clock: Callable[[], float] = time.time,
        *,
        touch_interval_s: float = 60.0,
    ) -> None:
        if budget_bytes < 0:
            raise InvalidArgument(f"chunk cache budget must be >= 0, got {budget_bytes}")
        self.root = root
        self.budget_bytes = budget_bytes
        self.stats = CacheStats()
        self._clock = clock
        self._touch_interval = touch_interval_s
        self._lock = threading.Lock()
        self._chunks: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._used = 0
        self._pins: Counter[str] = Counter()  # chunks being put: never evicted meanwhile
        self._opened = False

    def open(self) -> None:
        """Create the root, delete leftover temporary files (and the earlier layout) and rebuild the index."""
        with self._lock:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                found = self._scan()
            except OSError as err:
                raise StoreError(f"cannot open chunk cache {self.root}: {err}") from err
            found.sort()
            self._chunks = OrderedDict((sha, _Entry(size, mtime, mtime)) for mtime, sha, size in found)
            self._used = sum(e.size for e in self._chunks.values())
            self._opened = True
            self._evict_locked()

    def path(self, sha256: str) -> Path:
        """Where the chunk ``sha256`` lives once present."""
        if not _SHA256.fullmatch(sha256):
            raise InvalidArgument(f"invalid chunk sha256 {sha256!r}: expected 64 lowercase hex digits")
        return self.root / sha256[:2] / sha256

    def contains(self, sha256: str) -> bool:
        self._require_open()
        with self._lock:
            return sha256 in self._chunks

    def get(self, sha256: str) -> bytes | None:
        """The chunk's bytes, verified against ``sha256``; None if absent or corrupt (a corrupt file is deleted)."""
        self._require_open()
        path = self.path(sha256)
        with self._lock:
            entry = self._chunks.get(sha256)
            if entry is None:
                self.stats.misses += 1
                return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            with self._lock:
                self.stats.misses += 1
                if self._chunks.get(sha256) is entry:
                    self._forget_locked(sha256)
            return None
        except OSError as err:
            raise StoreError(f"cannot read cached chunk {path}: {err}") from err
        if hashlib.sha256(data).hexdigest() != sha256:
            with self._lock:
                self.stats.corrupt += 1
                self.stats.misses += 1
                if self._chunks.get(sha256) is entry and not self._pins[sha256]:
                    self._forget_locked(sha256)
                    with suppress(OSError):
                        path.unlink()
            return None
        now = self._clock()
        touch = False
        with self._lock:
            self.stats.hits += 1
            if self._chunks.get(sha256) is entry:
                self._chunks.move_to_end(sha256)
                entry.used = now
                if now - entry.touched >= self._touch_interval:
                    entry.touched, touch = now, True
        if touch:  # mirror the last use into the mtime for the next open(); metadata only, no fsync
            with suppress(OSError):
                os.utime(path, (now, now))
        return data

    def put(self, sha256: str, data: bytes) -> None:
        """PutDurable: temp file, fdatasync, rename, fsync dir, then mark present; then evict down to budget.
        ``data`` must hash to ``sha256`` (the resolver verified it; a read verifies it again)."""
        self._require_open()
        path = self.path(sha256)
        with self._lock:
            self._pins[sha256] += 1
        try:
            now = self._clock()
            size = self._write_durable(path, data, now)
            with self._lock:
                self.stats.puts += 1
                old = self._chunks.pop(sha256, None)
                self._used += size - (old.size if old else 0)
                self._chunks[sha256] = _Entry(size, now, now)
                self._evict_locked()
        finally:
            with self._lock:
                self._pins[sha256] -= 1
                if not self._pins[sha256]:
                    del self._pins[sha256]

    def digests(self) -> list[str]:
        """The present chunks, least recently used first."""
        self._require_open()
        with self._lock:
            return list(self._chunks)

    @property
    def used_bytes(self) -> int:
        """Allocated bytes (``st_blocks * 512``) of the present chunk files."""
        with self._lock:
            return self._used

    # -- internals -------------------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._opened:
            raise StateError(f"chunk cache {self.root} is not open: call open() first", state="closed")

    def _write_durable(self, path: Path, data: bytes, now: float) -> int:
        """Make ``path`` hold ``data`` durably and atomically; returns its allocated bytes."""
        directory = path.parent
        tmp = directory / f".{path.name}.tmp.{os.getpid()}.{os.urandom(6).hex()}"
        try:
            try:
                directory.mkdir()
                fsync_dir(self.root)  # a new fan-out directory must survive a crash along with its chunks
            except FileExistsError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.utime(fd, (now, now))
                os.fdatasync(fd)
                size = os.fstat(fd).st_blocks * 512
            finally:
                os.close(fd)
            os.rename(tmp, path)
            fsync_dir(directory)
        except OSError as err:
            with suppress(OSError):
                tmp.unlink()
            raise StoreError(f"cannot store chunk {path}: {err}") from err
        return size

    def _scan(self) -> list[tuple[float, str, int]]:
        """``(mtime, sha256, allocated bytes)`` of every chunk file; leftovers and the earlier layout removed."""
        found: list[tuple[float, str, int]] = []
        for directory in os.scandir(self.root):
            if _LEGACY.fullmatch(directory.name) and directory.is_dir(follow_symlinks=False):
                shutil.rmtree(directory.path, ignore_errors=True)
                continue
            if not (_FANOUT.fullmatch(directory.name) and directory.is_dir(follow_symlinks=False)):
                continue
            for item in os.scandir(directory.path):
                temp = _TEMP.fullmatch(item.name)
                if temp and self._is_leftover(int(temp[2])):
                    with suppress(FileNotFoundError):
                        os.unlink(item.path)
                elif (
                    _SHA256.fullmatch(item.name)
                    and item.name.startswith(directory.name)
                    and item.is_file(follow_symlinks=False)
                ):
                    with suppress(FileNotFoundError):
                        st = item.stat(follow_symlinks=False)
                        found.append((st.st_mtime, item.name, st.st_blocks * 512))
        return found

    def _is_leftover(self, pid: int) -> bool:
        """A temp file is a leftover unless a live process (or a put of ours in flight) may still rename it."""
        if pid == os.getpid():
            return not self._pins
        if pid <= 0:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError as err:  # EPERM: alive, someone else's
            return err.errno != errno.EPERM
        return False

    def _evict_locked(self) -> None:
        """Evict least recently used chunks until within budget; chunks being put are never evicted."""
        while self._used > self.budget_bytes:
            victim = next((sha for sha in self._chunks if not self._pins[sha]), None)
            if victim is None:
                return
            size = self._remove_locked(victim)
            self.stats.evictions += 1
            self.stats.evicted_bytes += size

    def _remove_locked(self, sha256: str) -> int:
        """Forget a chunk and delete its file (under the lock, so a concurrent put cannot be deleted)."""
        size = self._forget_locked(sha256)
        with suppress(OSError):  # a file that cannot be deleted is forgotten all the same
            os.unlink(self.path(sha256))
        return size

    def _forget_locked(self, sha256: str) -> int:
        entry = self._chunks.pop(sha256)
        self._used -= entry.size
        return entry.size
