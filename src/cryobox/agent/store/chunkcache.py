"""The per-host durable chunk cache, shared by every restore and surviving agent restarts.

Layout::

    <root>/<identity>/<idx:08d>                    one verified chunk (its mtime = last use, see below)
    <root>/<identity>/.<idx>.tmp.<pid>.<random>    a chunk being written (leftovers removed by open())

``identity`` (:func:`cache_identity`) names one memory image generation in one store: a hash of the store URL,
the key and the generation, so two stores or two generations never share chunks.

A chunk becomes present only through ``PutDurable``: write a temporary file in the same directory, fdatasync,
rename it to its final name, fsync the directory, and only then mark it present in the in-memory index. A
process killed at any moment therefore leaves either no chunk or a complete one under the final name (plus,
maybe, a temporary file that the next open() removes). Every read from disk is verified against the sha256
the caller expects anyway; a mismatch deletes the file and reads as a miss.

The budget counts allocated blocks (``st_blocks * 512``) of the chunk files. Eviction is LRU by generation:
the least recently used identity loses its least recently used chunks first. Last use is kept in memory and
mirrored into each chunk file's mtime (set when written, refreshed on a hit at most every
``touch_interval_s``; never fsynced), and open() rebuilds the index and both LRU orders from the files.
One process owns a cache root at a time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import InvalidArgument, StateError, StoreError
from ...util.files import fsync_dir

_IDENTITY = re.compile(r"[0-9a-f]{32}")
_CHUNK = re.compile(r"[0-9]{8,}")
_TEMP = re.compile(r"\.([0-9]+)\.tmp\.([0-9]+)\.[0-9a-f]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def cache_identity(store_url: str, key: str, generation: str) -> str:
    """sha256 hex[:32] of the full identity of one image generation: store URL, object key and generation."""
    return hashlib.sha256(json.dumps([store_url, key, generation]).encode()).hexdigest()[:32]


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0  # absent, vanished or corrupt
    puts: int = 0
    corrupt: int = 0  # reads whose bytes did not match the expected sha256 (the file was deleted)
    evictions: int = 0
    evicted_bytes: int = 0


@dataclass
class _Entry:
    size: int  # allocated bytes
    used: float  # last use (clock)
    touched: float  # the file's mtime as last set by us


@dataclass
class _Generation:
    used: float = 0.0
    chunks: OrderedDict[int, _Entry] = field(default_factory=OrderedDict)  # least recently used first


class ChunkCache:
    """Verified chunks on local disk, bounded by ``budget_bytes`` of allocated blocks; thread-safe."""

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
        self._gens: dict[str, _Generation] = {}
        self._used = 0
        self._pins: Counter[tuple[str, int]] = Counter()  # chunks being put: never evicted meanwhile
        self._opened = False

    def open(self) -> None:
        """Create the root, delete leftover temporary files and rebuild the index from the chunk files."""
        with self._lock:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                gens = {name: gen for name, gen in self._scan() if gen.chunks}
            except OSError as err:
                raise StoreError(f"cannot open chunk cache {self.root}: {err}") from err
            self._gens = gens
            self._used = sum(e.size for gen in gens.values() for e in gen.chunks.values())
            self._opened = True
            self._evict_locked()

    def path(self, identity: str, idx: int) -> Path:
        """Where chunk ``idx`` of ``identity`` lives once present."""
        if not _IDENTITY.fullmatch(identity):
            raise InvalidArgument(f"invalid cache identity {identity!r}: expected 32 lowercase hex digits")
        if idx < 0:
            raise InvalidArgument(f"invalid chunk index {idx}")
        return self.root / identity / f"{idx:08d}"

    def contains(self, identity: str, idx: int) -> bool:
        self._require_open()
        with self._lock:
            gen = self._gens.get(identity)
            return gen is not None and idx in gen.chunks

    def get(self, identity: str, idx: int, sha256: str) -> bytes | None:
        """The chunk's bytes, verified against ``sha256``; None if absent or corrupt (a corrupt file is deleted)."""
        self._require_open()
        path = self.path(identity, idx)
        if not _SHA256.fullmatch(sha256):
            raise InvalidArgument(f"invalid sha256 {sha256!r} for chunk {idx}")
        with self._lock:
            entry = self._entry(identity, idx)
            if entry is None:
                self.stats.misses += 1
                return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            with self._lock:
                self.stats.misses += 1
                if self._entry(identity, idx) is entry:
                    self._forget_locked(identity, idx)
            return None
        except OSError as err:
            raise StoreError(f"cannot read cached chunk {path}: {err}") from err
        if hashlib.sha256(data).hexdigest() != sha256:
            with self._lock:
                self.stats.corrupt += 1
                self.stats.misses += 1
                if self._entry(identity, idx) is entry and not self._pins[identity, idx]:
                    self._forget_locked(identity, idx)
                    with suppress(OSError):
                        path.unlink()
            return None
        now = self._clock()
        touch = False
        with self._lock:
            self.stats.hits += 1
            if self._entry(identity, idx) is entry:
                gen = self._gens[identity]
                gen.chunks.move_to_end(idx)
                gen.used = entry.used = now
                if now - entry.touched >= self._touch_interval:
                    entry.touched, touch = now, True
        if touch:  # mirror the last use into the mtime for the next open(); metadata only, no fsync
            with suppress(OSError):
                os.utime(path, (now, now))
        return data

    def put(self, identity: str, idx: int, data: bytes) -> None:
        """PutDurable: temp file, fdatasync, rename, fsync dir, then mark present; then evict down to budget."""
        self._require_open()
        path = self.path(identity, idx)
        with self._lock:
            self._pins[identity, idx] += 1
        try:
            now = self._clock()
            size = self._write_durable(path, data, now)
            with self._lock:
                self.stats.puts += 1
                gen = self._gens.setdefault(identity, _Generation())
                old = gen.chunks.pop(idx, None)
                self._used += size - (old.size if old else 0)
                gen.chunks[idx] = _Entry(size, now, now)
                gen.used = now
                self._evict_locked()
        finally:
            with self._lock:
                self._pins[identity, idx] -= 1
                if not self._pins[identity, idx]:
                    del self._pins[identity, idx]

    def discard(self, identity: str) -> int:
        """Drop every chunk of ``identity`` (e.g. its generation was deleted); returns the bytes freed."""
        self._require_open()
        self.path(identity, 0)  # validates identity
        with self._lock:
            gen = self._gens.get(identity)
            freed = 0
            for idx in list(gen.chunks) if gen else []:
                if not self._pins[identity, idx]:
                    freed += self._remove_locked(identity, idx)
            return freed

    def chunks(self, identity: str) -> list[int]:
        """The present chunks of ``identity``, least recently used first."""
        self._require_open()
        with self._lock:
            gen = self._gens.get(identity)
            return list(gen.chunks) if gen else []

    def identities(self) -> list[str]:
        """The identities with present chunks, least recently used first."""
        self._require_open()
        with self._lock:
            return sorted(self._gens, key=lambda name: self._gens[name].used)

    @property
    def used_bytes(self) -> int:
        """Allocated bytes (``st_blocks * 512``) of the present chunk files."""
        with self._lock:
            return self._used

    # -- internals -------------------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._opened:
            raise StateError(f"chunk cache {self.root} is not open: call open() first", state="closed")

    def _entry(self, identity: str, idx: int) -> _Entry | None:
        gen = self._gens.get(identity)
        return gen.chunks.get(idx) if gen else None

    def _write_durable(self, path: Path, data: bytes, now: float) -> int:
        """Make ``path`` hold ``data`` durably and atomically; returns its allocated bytes."""
        directory = path.parent
        tmp = directory / f".{int(path.name)}.tmp.{os.getpid()}.{os.urandom(6).hex()}"
        try:
            try:
                directory.mkdir()
                fsync_dir(self.root)  # a new identity directory must survive a crash along with its chunks
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

    def _scan(self) -> list[tuple[str, _Generation]]:
        """(identity, generation) for every identity directory, LRU orders rebuilt from the files' mtimes."""
        found: list[tuple[str, _Generation]] = []
        for directory in os.scandir(self.root):
            if not (_IDENTITY.fullmatch(directory.name) and directory.is_dir(follow_symlinks=False)):
                continue
            chunks: list[tuple[float, int, int]] = []
            for item in os.scandir(directory.path):
                temp = _TEMP.fullmatch(item.name)
                if temp and self._is_leftover(int(temp[2])):
                    with suppress(FileNotFoundError):
                        os.unlink(item.path)
                elif _CHUNK.fullmatch(item.name) and item.is_file(follow_symlinks=False):
                    with suppress(FileNotFoundError):
                        st = item.stat(follow_symlinks=False)
                        chunks.append((st.st_mtime, int(item.name), st.st_blocks * 512))
            if not chunks:
                if not any(pin[0] == directory.name for pin in self._pins):
                    with suppress(OSError):
                        os.rmdir(directory.path)
                continue
            chunks.sort()
            entries = OrderedDict((idx, _Entry(size, mtime, mtime)) for mtime, idx, size in chunks)
            found.append((directory.name, _Generation(chunks[-1][0], entries)))
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
        """Evict LRU-by-generation until within budget; chunks being put are never evicted."""
        while self._used > self.budget_bytes:
            victim = next(
                (
                    (identity, idx)
                    for identity, gen in sorted(self._gens.items(), key=lambda item: item[1].used)
                    for idx in gen.chunks
                    if not self._pins[identity, idx]
                ),
                None,
            )
            if victim is None:
                return
            size = self._remove_locked(*victim)
            self.stats.evictions += 1
            self.stats.evicted_bytes += size

    def _remove_locked(self, identity: str, idx: int) -> int:
        """Forget a chunk and delete its file (under the lock, so a concurrent put cannot be deleted)."""
        size = self._forget_locked(identity, idx)
        with suppress(OSError):  # a file that cannot be deleted is forgotten all the same
            os.unlink(self.path(identity, idx))
        if identity not in self._gens and not any(pin[0] == identity for pin in self._pins):
            with suppress(OSError):
                os.rmdir(self.root / identity)
        return size

    def _forget_locked(self, identity: str, idx: int) -> int:
        gen = self._gens[identity]
        entry = gen.chunks.pop(idx)
        self._used -= entry.size
        if not gen.chunks:
            del self._gens[identity]
        return entry.size
