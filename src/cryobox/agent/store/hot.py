"""Memory images on tmpfs ("hot" copies) for the VMs that map them.

QEMU's ``background-snapshot`` write-protects guest RAM with userfaultfd, which on this kernel works for a
``MAP_PRIVATE`` mapping of a tmpfs (shmem) file but not of an ext4/xfs file. So every memory image a VM maps is
first copied, sparsely, into a per-host directory on tmpfs::

    <root>/<key>/memory   the hot copy of one memory image (every VM restored from it maps this one file,
                          so they share its page cache)

``key`` names the image's content (e.g. a template generation): a key already present is never copied again.
The root is wiped when the agent starts (except what adopted VMs map) and when it stops with ``--on-stop kill``;
VMs still mapping an unlinked file keep their pages.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path

from ...errors import InvalidArgument
from .volume import copy_sparse

_KEY = re.compile(r"[A-Za-z0-9._-]{1,200}")


def default_hot_dir(data_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """``$CRYOBOX_HOT_DIR`` if set, else ``/dev/shm/cryobox-<hash of the data dir>`` (one per agent)."""
    override = (os.environ if env is None else env).get("CRYOBOX_HOT_DIR")
    if override:
        return Path(override)
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"cryobox-{digest}"


class HotImages:
    """Hot copies of memory images under ``root``; an image is copied at most once however many ask for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}

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
        if hot.exists():
            return hot
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            async with lock:
                if not hot.exists():
                    await asyncio.to_thread(_copy_in, src, hot)
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._locks[key]
        return hot

    def drop(self, key: str) -> None:
        """Remove the hot copy for ``key`` (nothing happens if there is none)."""
        shutil.rmtree(self.path(key).parent, ignore_errors=True)

    def close(self) -> None:
        """Remove ``root`` and everything in it."""
        self.wipe()
        self.root.rmdir()


def _copy_in(src: Path, hot: Path) -> None:
    hot.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    hot.parent.mkdir(exist_ok=True)
    copy_sparse(src, hot)
