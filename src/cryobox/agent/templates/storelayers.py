"""The step cache across the fleet: a host's step layers published to the object store, fetched by the others.

The store side's layout and budget are :mod:`cryobox.objstore.buildsteps`'s. Here, on a host:

* :meth:`StoreLayers.find` is the step cache's lookup: a local entry, else the stored layer of that key, if it was
  built on exactly the parent this host has (the parent's key and version; for the first layer of a chain, a raw
  base image whose content identity, :meth:`StoreLayers.base_identity`, matches). The layer is downloaded next to
  the cache, its size and sha256 checked against the meta before it is renamed into place, checked to be a plain
  qcow2 (no external data file), and rebased
  (``qemu-img rebase -u``) onto the local parent. Anything that does not fit or fails is a miss (the step is built).
* :meth:`StoreLayers.after_build` publishes the build's chain root first (the layer object, then the meta) where
  the store lacks it, stops at a key the store holds in another version (our descendants sit on ours), rewrites a
  stale ``last_used`` (at most once per :data:`~cryobox.objstore.buildsteps.TOUCH_S`; a marker file in the local
  entry saves even the GET within that time), then trims the store to its budget. Store failures are logged, never
  a failed build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import CryoboxError, IntegrityError, StoreError
from ...objstore.buildsteps import TOUCH_S, StepMeta, read_meta, trim_steps
from ...objstore.chunkfmt import scan_image
from ...objstore.client import ObjectStore
from ...objstore.keys import build_step_layer, build_step_meta
from ..disk.qcow2 import backing_file
from .layercache import LayerCache

STORED = "stored"
"""A local entry's marker: its mtime is when this host last found it in the store (and touched it there)."""
READ_BLOCK = 1 << 20


@dataclass
class Published:
    keys: list[str] = dataclasses.field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    trimmed: int = 0


class StoreLayers:
    def __init__(
        self,
        store: ObjectStore,
        layers: LayerCache,
        *,
        log: Callable[[str], None] = lambda _line: None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.layers, self.log, self.wall, self.mono = store, layers, log, wall, mono
        self._bases: dict[Path, str] = {}

    def base_identity(self, image: Path) -> str:
        """What names a raw base image's content wherever it is: the sha256 of its chunk index (holes skipped)."""
        if image not in self._bases:
            index = scan_image(image, "build-base")
            self._bases[image] = hashlib.sha256(index.to_bytes()).hexdigest()
        return self._bases[image]

    def find(self, key: str, parent: Path) -> Path | None:
        """``key``'s layer from the local cache, else from the store over ``parent`` (the local parent layer or
        the raw base image); ``None``: a miss."""
        local = self.layers.lookup(key)
        if local is not None:
            return local
        try:
            return self._fetch(key, parent)
        except (CryoboxError, OSError, subprocess.CalledProcessError) as err:
            self.log(f"step layer {key[:12]} not taken from the store: {_reason(err)}")
            return None

    def _fetch(self, key: str, parent: Path) -> Path | None:
        meta = read_meta(self.store, key)
        if meta is None:
            return None
        parent_key = self.layers.key_of(parent)
        if parent_key is not None:
            if meta.parent != parent_key or meta.parent_version != self.layers.version(parent_key):
                self.log(f"step layer {key[:12]} in the store sits on another build of its parent")
                return None
        elif meta.parent is not None or meta.base != self.base_identity(parent):
            self.log(f"step layer {key[:12]} in the store sits on a base image this host does not have")
            return None
        started = self.mono()
        self.layers.root.mkdir(parents=True, exist_ok=True)
        tmp = self.layers.root / f".fetch-{key}.{os.getpid()}.{secrets.token_hex(4)}.qcow2"
        try:
            self.store.download(meta.layer_key, tmp, verify=_pinned(meta))
            _check_layer(tmp, meta.layer_key)
            path = self.layers.store(key, tmp, parent, version=meta.version, move=True)
        finally:
            tmp.unlink(missing_ok=True)
        path = path or self.layers.lookup(key)  # stored meanwhile by another build: theirs
        if path is not None:
            self._mark(key)
            self.log(
                f"step layer {key[:12]} fetched from the store ({meta.size / (1 << 20):.1f} MiB, "
                f"{self.mono() - started:.2f} s)"
            )
        return path

    def after_build(self, keys: Sequence[str], budget: int) -> Published:
        """Publish (or touch) the local layers of ``keys`` (in chain order) and trim the store to ``budget``."""
        done = Published()
        started = self.mono()
        try:
            for key in keys:
                if not self._publish(key, done):
                    break
            done.trimmed = len(trim_steps(self.store, budget, self.wall()))
        except (CryoboxError, OSError, subprocess.CalledProcessError) as err:
            self.log(f"the build's step layers were not all published to the store: {_reason(err)}")
        done.seconds = self.mono() - started
        if done.keys or done.trimmed:
            self.log(
                f"published {len(done.keys)} step layer(s) to the store ({done.bytes / (1 << 20):.1f} MiB, "
                f"{done.seconds:.2f} s); {done.trimmed} object(s) trimmed from the store's step cache"
            )
        return done

    def _publish(self, key: str, done: Published) -> bool:
        """Whether the store now holds our ``key`` (so its children may follow)."""
        layer = self.layers.lookup(key)
        if layer is None:
            return True  # not a layer (a Debian or template base's key), or not cached: nothing over it is either
        if self._marked_recently(key):
            return True
        version = self.layers.version(key)
        now = self.wall()
        found = read_meta(self.store, key)
        if found is not None:
            if found.version != version:
                return False  # the store has another host's build of it: our descendants do not fit its
            if now - found.last_used >= TOUCH_S:
                self.store.put(build_step_meta(key), dataclasses.replace(found, last_used=now).to_bytes())
            self._mark(key)
            return True
        parent = backing_file(layer)
        if parent is None:
            raise StoreError(f"step layer {layer} has no backing file")
        parent_key = self.layers.key_of(parent)
        size, sha = _hash_file(layer)
        meta = StepMeta(
            key=key,
            version=version,
            size=size,
            sha256=sha,
            parent=parent_key,
            parent_version=self.layers.version(parent_key) if parent_key is not None else None,
            base=None if parent_key is not None else self.base_identity(parent),
            created=now,
            last_used=now,
        )
        self.store.put_file(build_step_layer(key, sha), layer)
        self.store.put(build_step_meta(key), meta.to_bytes())  # last: the entry is whole
        self._mark(key)
        done.keys.append(key)
        done.bytes += size
        return True

    def _marked_recently(self, key: str) -> bool:
        try:
            return self.wall() - (self.layers.root / key / STORED).stat().st_mtime < TOUCH_S
        except OSError:
            return False

    def _mark(self, key: str) -> None:
        mark = self.layers.root / key / STORED
        try:
            mark.touch()
            now = self.wall()
            os.utime(mark, (now, now))
        except OSError:
            pass  # the entry was trimmed meanwhile


def _pinned(meta: StepMeta) -> Callable[[int, str], None]:
    def verify(size: int, sha256: str) -> None:
        if size != meta.size or sha256 != meta.sha256:
            raise IntegrityError(
                f"stored step layer {meta.layer_key} is not what its meta pins (size {size}, sha256 {sha256[:16]})",
                details={"key": meta.layer_key},
            )

    return verify


def _check_layer(path: Path, key: str) -> None:
    """A stored layer is a plain qcow2 (no external data file: QEMU would open a host path the store named)."""
    info = json.loads(
        subprocess.run(
            ["qemu-img", "info", "--output=json", "-f", "qcow2", str(path)], check=True, capture_output=True
        ).stdout
    )
    data = info.get("format-specific", {}).get("data", {})
    if info.get("format") != "qcow2" or "data-file" in data or data.get("corrupt"):
        raise IntegrityError(f"stored step layer {key} is not a plain qcow2 layer", details={"key": key})


def _hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(READ_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _reason(err: BaseException) -> str:
    return err.message if isinstance(err, CryoboxError) else str(err)


__all__ = ["Published", "StoreLayers"]
