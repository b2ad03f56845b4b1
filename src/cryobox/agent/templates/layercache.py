"""The step cache of recipe builds: one qcow2 layer per step result, named by the step's cache key.

``<images>/steps/<key>/layer.qcow2`` holds exactly what one step wrote, over its parent's layer (or the base
image) as its qcow2 backing file, so a cached prefix of a recipe is a ready-made chain: a rebuild boots its build
VM on the last cached layer and runs only the steps after it. An entry is whole once its directory exists (written
in a temporary sibling, renamed into place); a lookup also checks that its whole backing chain still exists.
:meth:`LayerCache.trim` keeps the cache under a byte budget (``CRYOBOX_BUILD_CACHE_BYTES``, default 20 GiB),
least recently used first (a lookup touches an entry).

Each entry also holds its ``version`` (a random token given when the layer is cut here, or the stored version of a
layer fetched from the object store, :mod:`.storelayers`): a child layer is a diff over exactly one parent, and
the versions are how a host tells its own build of a key from another host's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from ...errors import CryoboxError
from ..disk.qcow2 import backing_chain

CACHE_BYTES_ENV = "CRYOBOX_BUILD_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 20 << 30
LAYER = "layer.qcow2"
VERSION = "version"


def cache_budget(env: dict[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(CACHE_BYTES_ENV, "")
    return int(raw) if raw.strip() else DEFAULT_CACHE_BYTES


class LayerCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        return self.root / key / LAYER

    def key_of(self, path: Path) -> str | None:
        """The key whose layer ``path`` is, or ``None`` (a base image)."""
        return path.parent.name if path.name == LAYER and path.parent.parent == self.root else None

    def version(self, key: str) -> str:
        """The version of ``key``'s layer (an entry stored before versions existed gets one now)."""
        mark = self.root / key / VERSION
        with contextlib.suppress(FileNotFoundError):
            return mark.read_text().strip()
        tmp = mark.with_name(f".{VERSION}.{os.getpid()}.{secrets.token_hex(4)}")
        tmp.write_text(secrets.token_hex(16))
        try:
            os.link(tmp, mark)  # the first writer's version stands
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return mark.read_text().strip()

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

    def store(
        self, key: str, layer: Path, parent: Path, *, version: str | None = None, move: bool = False
    ) -> Path | None:
        """Keep ``layer`` (a closed step layer) as ``key``'s entry with ``parent`` as its backing file; ``None``
        if another build stored the key first (then later steps must not build on ours: they are not cached).
        ``version``: the layer's (a fresh one when ``None``); ``move``: take ``layer`` itself rather than a copy."""
        final = self.root / key
        if final.exists():
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        work = self.root / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            copy = work / LAYER
            if move:
                os.replace(layer, copy)
            else:
                shutil.copyfile(layer, copy)
            (work / VERSION).write_text(version or secrets.token_hex(16))
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
