"""What a pull (or a load from a local layout or archive) hands the template build."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..recipe.model import ImageConfig


@dataclass(frozen=True)
class PulledImage:
    source: str
    """The reference as normalised (``docker.io/library/busybox:latest``), or the local path it was read from."""
    digest: str
    """The manifest's ``sha256:`` digest (of the platform's manifest, not of an index above it)."""
    platform: str
    """``os/architecture[/variant]`` from the image's config."""
    config: ImageConfig
    layers: list[Path]
    """Plain tar files, bottom layer first, in the destination directory."""
    diff_ids: list[str] = field(default_factory=list)
    """The ``sha256:`` of each tar in :attr:`layers` (verified against the config)."""
    compressed_bytes: int = 0
    """All layers as they travel (what the manifest declares)."""
    uncompressed_bytes: int = 0
    """All layer tars together."""
    downloaded_bytes: int = 0
    """Blob bytes this call fetched (0 when every blob came from the content cache)."""
    index_digest: str = ""
    """The digest of the index the manifest was chosen from, if the reference named one."""


__all__ = ["PulledImage"]
