"""The files every restorable image directory has (a baked template or a snapshot)."""

from __future__ import annotations

from pathlib import Path


class ImageFiles:
    """Mixin for a dataclass with a ``path``: ``memory`` (raw RAM; restores map it MAP_PRIVATE), ``vmstate``
    (device state only) and ``disk.qcow2`` (the root-disk overlay)."""

    path: Path

    @property
    def memory(self) -> Path:
        return self.path / "memory"

    @property
    def vmstate(self) -> Path:
        return self.path / "vmstate"

    @property
    def disk(self) -> Path:
        return self.path / "disk.qcow2"
