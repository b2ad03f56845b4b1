"""Host paths and settings, read once at start and validated (fail fast)."""

from __future__ import annotations

import os
from dataclasses import dataclass
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

    @classmethod
    def from_env(cls, data_dir: Path | None = None, cache_dir: Path | None = None) -> Paths:
        data = data_dir or Path(os.environ.get("CRYOBOX_DATA_DIR", DEFAULT_DATA_DIR))
        cache = cache_dir or Path(os.environ.get("CRYOBOX_CACHE_DIR", DEFAULT_CACHE_DIR))
        return cls(data_dir=data.resolve(), cache_dir=cache.resolve())

    @property
    def run_dir(self) -> Path:
        """Per-VM runtime directories (sockets, overlays, logs); reclaimed at agent start."""
        return self.data_dir / "run"

    @property
    def images_dir(self) -> Path:
        return self.cache_dir / "images"

    @property
    def templates_dir(self) -> Path:
        return self.cache_dir / "templates"

    def ensure(self) -> None:
        for path in (self.data_dir, self.run_dir, self.images_dir, self.templates_dir):
            path.mkdir(parents=True, exist_ok=True)
