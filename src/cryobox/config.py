"""Host paths and settings, read once at start and validated (fail fast)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DATA_DIR = Path("/var/lib/cryobox")
DEFAULT_CACHE_DIR = Path("/var/cache/cryobox")


@dataclass(frozen=True)
class Paths:
    """Where a cryobox host keeps its files.

    ``cache_dir`` holds content-addressed, immutable build products (kernel, initramfs, rootfs images, baked
    templates); it can be shared by many data dirs. ``data_dir`` holds one platform's mutable state.
    """

    data_dir: Path
    cache_dir: Path
    hot_dir: Path = field(default=Path())
    """Memory images VMs map, on tmpfs (``CRYOBOX_HOT_DIR``; default ``/dev/shm/cryobox-<hash of data_dir>``)."""

    def __post_init__(self) -> None:
        if self.hot_dir == Path():
            digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]
            hot = os.environ.get("CRYOBOX_HOT_DIR") or f"/dev/shm/cryobox-{digest}"
            object.__setattr__(self, "hot_dir", Path(hot))

    @classmethod
    def from_env(cls, data_dir: Path | None = None, cache_dir: Path | None = None) -> Paths:
        data = data_dir or Path(os.environ.get("CRYOBOX_DATA_DIR", DEFAULT_DATA_DIR))
        cache = cache_dir or Path(os.environ.get("CRYOBOX_CACHE_DIR", DEFAULT_CACHE_DIR))
        return cls(data_dir=data.resolve(), cache_dir=cache.resolve())

    @property
    def volume_dir(self) -> Path:
        """The reflink-capable volume (the data dir itself, or an XFS image loop-mounted here)."""
        return self.data_dir / "vol"

    @property
    def run_dir(self) -> Path:
        """Per-VM runtime directories (sockets, disk overlays, logs); reclaimed at agent start."""
        return self.volume_dir / "run"

    @property
    def snapshots_dir(self) -> Path:
        return self.volume_dir / "snapshots"

    @property
    def hibernate_dir(self) -> Path:
        """Captures of hibernated sandboxes (durable: a restarted agent wakes them)."""
        return self.volume_dir / "hibernate"

    @property
    def volumes_dir(self) -> Path:
        """The images of the volumes this host holds (:mod:`cryobox.agent.volumes`; durable)."""
        return self.volume_dir / "volumes"

    @property
    def records_dir(self) -> Path:
        """One durable record per sandbox (what a restarted agent re-adopts)."""
        return self.volume_dir / "sandboxes"

    @property
    def bake_dir(self) -> Path:
        """Run directories of template bakes (sockets and logs only)."""
        return self.data_dir / "bake"

    @property
    def memserver_dir(self) -> Path:
        """The memory server's mount point, control socket, pid file and log."""
        return self.data_dir / "memserver"

    @property
    def chunk_cache_dir(self) -> Path:
        """The host's durable cache of memory chunks fetched from the object store (survives restarts)."""
        return self.data_dir / "chunks"

    @property
    def default_store_url(self) -> str:
        """The embedded object store: a directory beside the image cache (objects are named by generation, so
        every data dir on the machine can share it)."""
        return f"file://{self.cache_dir / 'store'}"

    @property
    def images_dir(self) -> Path:
        return self.cache_dir / "images"

    @property
    def templates_dir(self) -> Path:
        return self.cache_dir / "templates"

    def ensure(self) -> None:
        """Create the directories; the data dir (keys, registry, records, VM run dirs) is readable by its owner
        only (jailed QEMUs reach their own files through bind mounts, never through it)."""
        for path in (self.data_dir, self.bake_dir, self.images_dir, self.templates_dir):
            path.mkdir(parents=True, exist_ok=True)
        if self.data_dir.stat().st_uid == os.getuid():
            self.data_dir.chmod(0o700)
