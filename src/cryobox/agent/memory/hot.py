"""Memory images on tmpfs ("hot" copies) for the VMs that map them.

QEMU's ``background-snapshot`` write-protects guest RAM with userfaultfd, which on this kernel works for a
``MAP_PRIVATE`` mapping of a tmpfs (shmem) file but not of an ext4/xfs file. So every memory image a VM maps is
first copied, sparsely, into a per-host directory on tmpfs::

    <root>/<key>/memory   the hot copy of one memory image (every VM restored from it maps this one file,
                          so they share its page cache)

``key`` names the image's content (e.g. a template generation): a key already present is never copied again.
The root is wiped when the agent starts (except what adopted VMs map) and when it stops with ``--on-stop kill``;
VMs still mapping an unlinked file keep their pages.

**Holes stay holes**: a read through a ``MAP_PRIVATE`` mapping of a tmpfs hole allocates a page of zeros in
the file, and a capture reads all of RAM (our pre-populate pass, QEMU's background-snapshot setup and its
stream), so after one snapshot a copy would occupy its whole RAM size. Captures are counted per copy
(:meth:`capturing`); when the last one ends, the ranges that are holes in the durable source are punched back
out (:meth:`punch_zeros`: the copy's holes as it was made; their bytes are zeros either way, and the private
copies a VM made of pages are not touched).

**Bounded**: copies together may take at most ``budget_bytes`` (``CRYOBOX_HOT_BUDGET_MIB``; default 75 % of
the tmpfs). A copy that does not fit first evicts, least recently ensured first, copies that are durable
elsewhere (made by :meth:`ensure` from a file that still exists), that no VM maps (``in_use``) and that were
not ensured in the last :data:`PIN_S` seconds (a VM about to map one); if that is not enough it raises
:class:`HotBudgetExceeded` and the caller pages the image lazily or refuses the restore (503).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from ...errors import HostUnavailable, InvalidArgument
from ...util.files import data_extents, punch_hole
from ..disk.volume import allocated_bytes, copy_sparse

_KEY = re.compile(r"[A-Za-z0-9._-]{1,200}")
ENV_BUDGET = "CRYOBOX_HOT_BUDGET_MIB"
log = logging.getLogger(__name__)
PIN_S = 60.0


class HotBudgetExceeded(HostUnavailable):
    """No room for another hot copy: everything there is mapped, pinned or the only copy."""


def default_budget(root: Path, env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(ENV_BUDGET, "").strip()
    if raw:
        try:
            return int(raw) << 20
        except ValueError:
            raise InvalidArgument(f"{ENV_BUDGET} must be an integer (MiB), not {raw!r}") from None
    probe = root if root.exists() else root.parent
    stat = os.statvfs(probe)
    return stat.f_blocks * stat.f_frsize * 3 // 4


def default_hot_dir(data_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """``$CRYOBOX_HOT_DIR`` if set, else ``/dev/shm/cryobox-<hash of the data dir>`` (one per agent)."""
    override = (os.environ if env is None else env).get("CRYOBOX_HOT_DIR")
    if override:
        return Path(override)
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"cryobox-{digest}"


class HotImages:
    """Hot copies of memory images under ``root``; an image is copied at most once however many ask for it."""

    def __init__(
        self,
        root: Path,
        budget_bytes: int | None = None,
        in_use: Callable[[], Collection[str]] = frozenset,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.in_use = in_use
        self.clock = clock
        self.evicted = 0
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        self._sources: dict[str, Path] = {}
        """Copies this process made from a durable file, and that file."""
        self._ensured: dict[str, float] = {}
        """When each key was last handed out (least recently ensured are evicted first)."""
        self._capturing: dict[str, int] = {}
        self._extents: dict[str, list[tuple[int, int]]] = {}
        """The data extents of each copy this process made, as made (everything else was a hole)."""
        self.punched_bytes = 0
        """Bytes given back to tmpfs by :meth:`punch_zeros` (all copies, since start)."""

    def wipe(self, keep: Collection[str] = ()) -> None:
        """Remove everything in ``root`` but the hot copies named in ``keep`` (adopted VMs map them), creating
        ``root`` (mode 0700) if needed."""
        if self.root.is_symlink():
            self.root.unlink()
        if self.root.is_dir() and keep:
            for entry in self.root.iterdir():
                if entry.name not in keep:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            return
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(mode=0o700, parents=True)

    def key_of(self, path: Path) -> str | None:
        """The key of the hot copy at ``path``, if it is one of ours."""
        return path.parent.name if path.parent.parent == self.root and path.name == "memory" else None

    def path(self, key: str) -> Path:
        """Where the hot copy for ``key`` lives (it may not exist)."""
        if not _KEY.fullmatch(key) or key in (".", ".."):
            raise InvalidArgument(f"invalid hot image key {key!r}: use 1-200 of [A-Za-z0-9._-]")
        return self.root / key / "memory"

    async def ensure(self, key: str, src: Path) -> Path:
        """Return the hot copy for ``key``, copying ``src`` there first if it is missing.

        Concurrent callers for one key wait for a single copy. The copy is written under a temporary name and
        renamed, so a half-written image is never visible at the returned path.
        """
        hot = self.path(key)
        self._ensured[key] = self.clock()
        if hot.exists():
            return hot
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            async with lock:
                if not hot.exists():
                    await asyncio.to_thread(self._make_room, key, allocated_bytes(src))
                    self._extents[key] = await asyncio.to_thread(_copy_in, src, hot)
                    self._sources[key] = src
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._locks[key]
        self._ensured[key] = self.clock()
        return hot

    @asynccontextmanager
    async def capturing(self, key: str | None) -> AsyncIterator[None]:
        """Held around a capture of a VM that maps the copy ``key``; when the last capture of that copy ends,
        its zero ranges are given back (:meth:`punch_zeros`)."""
        if key is None:
            yield
            return
        self._capturing[key] = self._capturing.get(key, 0) + 1
        try:
            yield
        finally:
            self._capturing[key] -= 1
            if not self._capturing[key]:
                del self._capturing[key]
                try:
                    await asyncio.to_thread(self.punch_zeros, key)
                except OSError as err:  # only bytes given back late; the capture itself is done
                    log.warning("could not give the zero ranges of hot copy %s back: %s", key, err)

    def punch_zeros(self, key: str) -> int:
        """Punch the copy ``key`` wherever it had a hole when it was made; returns the bytes freed. Only while no
        capture of a VM mapping it runs (a write-protected range must stay mapped); a copy this process did not
        make (an earlier agent's, a fresh-RAM file) is left alone."""
        extents = self._extents.get(key)
        hot = self.path(key)
        if key in self._capturing or extents is None or not hot.exists():
            return 0
        before = allocated_bytes(hot)
        with open(hot, "rb+") as fout:
            size = os.fstat(fout.fileno()).st_size
            offset = 0
            for start, end in [*extents, (size, size)]:
                if start > offset:
                    punch_hole(fout.fileno(), offset, start - offset)
                offset = end
        freed = max(0, before - allocated_bytes(hot))
        self.punched_bytes += freed
        return freed

    def used_bytes(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(allocated_bytes(d / "memory") for d in self.root.iterdir() if (d / "memory").exists())

    def _make_room(self, key: str, needed: int) -> None:
        if self.budget_bytes is None:
            return
        used = self.used_bytes()
        if used + needed <= self.budget_bytes:
            return
        busy, now = set(self.in_use()), self.clock()
        candidates = sorted(
            (k for k, src in self._sources.items() if k != key and k not in busy and src.exists()),
            key=lambda k: self._ensured.get(k, 0.0),
        )
        for victim in candidates:
            if now - self._ensured.get(victim, 0.0) < PIN_S:
                continue
            freed = allocated_bytes(self.path(victim))
            self.drop(victim)
            self.evicted += 1
            used -= freed
            if used + needed <= self.budget_bytes:
                return
        raise HotBudgetExceeded(
            f"hot memory budget of {self.budget_bytes >> 20} MiB is full ({used >> 20} MiB mapped or pinned)",
            details={"budget_mib": self.budget_bytes >> 20, "used_mib": used >> 20, "needed_mib": needed >> 20},
        )

    def drop(self, key: str) -> None:
        """Remove the hot copy for ``key`` (nothing happens if there is none)."""
        shutil.rmtree(self.path(key).parent, ignore_errors=True)
        self._sources.pop(key, None)
        self._extents.pop(key, None)
        self._ensured.pop(key, None)

    def close(self) -> None:
        """Remove ``root`` and everything in it."""
        self.wipe()
        self.root.rmdir()


def _copy_in(src: Path, hot: Path) -> list[tuple[int, int]]:
    """Copy ``src`` to ``hot`` sparsely; returns the copy's data extents."""
    hot.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    hot.parent.mkdir(exist_ok=True)
    copy_sparse(src, hot)
    with open(hot, "rb") as fh:
        return list(data_extents(fh.fileno(), os.fstat(fh.fileno()).st_size))
