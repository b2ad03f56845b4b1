"""The step cache of recipe builds: one qcow2 layer per step result, named by the step's cache key.

``<images>/steps/<key>/layer.qcow2`` holds exactly what one step wrote, over its parent's layer (or the base
image) as its qcow2 backing file, so a cached prefix of a recipe is a ready-made chain: a rebuild boots its build
VM on the last cached layer and runs only the steps after it. An entry is whole once its directory exists (written
in a temporary sibling, renamed into place); a lookup also checks that its whole backing chain still exists.
:meth:`LayerCache.trim` keeps the cache under a byte budget (``CRYOBOX_BUILD_CACHE_BYTES``, default 20 GiB),
least recently used first (a lookup touches an entry).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from ...errors import CryoboxError
from ..disk.qcow2 import backing_chain

CACHE_BYTES_ENV = "CRYOBOX_BUILD_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 20 << 30
LAYER = "layer.qcow2"


def cache_budget(env: dict[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(CACHE_BYTES_ENV, "")
    return int(raw) if raw.strip() else DEFAULT_CACHE_BYTES


class LayerCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        return self.root / key / LAYER

    def lookup(self, key: str) -> Path | None:
        """The layer of ``key`` if it and its whole backing chain exist (touched as used)."""
        layer = self.path(key)
        if not layer.exists():
            return None
        try:
            chain = backing_chain(layer)
        except (CryoboxError, OSError, subprocess.CalledProcessError):
            return None
        if not all(p.exists() for p in chain):
            return None
        with contextlib.suppress(OSError):
            os.utime(layer.parent)
        return layer

    def store(self, key: str, layer: Path, parent: Path) -> Path | None:
        """Keep ``layer`` (a closed step layer) as ``key``'s entry with ``parent`` as its backing file; ``None``
        if another build stored the key first (then later steps must not build on ours: they are not cached)."""
        final = self.root / key
        if final.exists():
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        work = self.root / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            copy = work / LAYER
            shutil.copyfile(layer, copy)
            fmt = "qcow2" if parent.suffix == ".qcow2" else "raw"
            subprocess.run(
                ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", fmt, "-b", str(parent), str(copy)],
                check=True,
                capture_output=True,
            )
            copy.chmod(0o444)
            try:
                os.rename(work, final)
            except OSError:
                return None  # stored meanwhile by another build
            return final / LAYER
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob(f"*/{LAYER}"))

    def trim(self, budget: int) -> list[str]:
        """Remove least recently used entries until the cache fits ``budget`` bytes; the removed keys."""
        entries = []
        for layer in self.root.glob(f"*/{LAYER}"):
            with contextlib.suppress(OSError):
                entries.append((layer.parent.stat().st_mtime, layer.stat().st_size, layer.parent))
        total = sum(size for _, size, _ in entries)
        removed: list[str] = []
        for _, size, directory in sorted(entries):
            if total <= budget:
                break
            shutil.rmtree(directory, ignore_errors=True)
            total -= size
            removed.append(directory.name)
        return removed


__all__ = ["CACHE_BYTES_ENV", "LayerCache", "cache_budget"]
