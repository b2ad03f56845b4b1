"""How a host keeps template memory: the object store, where a restore's RAM comes from, the memory server's
settings (one value shared by ``cryobox serve`` and the host agent)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_CHUNK_CACHE_BYTES = 8 << 30


class MemoryMode(enum.Enum):
    """``hot``: restores map a tmpfs copy of a local image; ``lazy``: they page RAM from the store on demand."""

    HOT = "hot"
    LAZY = "lazy"


class TemplateSource(enum.Enum):
    """``build``: bake templates on this host (and publish them); ``store``: fetch published ones."""

    BUILD = "build"
    STORE = "store"


@dataclass(frozen=True)
class StorageConfig:
    store_url: str | None = None
    """Object store for published templates (``CRYOBOX_STORE_URL``; default: ``Paths.default_store_url``)."""
    memory_mode: MemoryMode = MemoryMode.HOT
    template_source: TemplateSource = TemplateSource.BUILD
    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES
    """Budget of the host chunk cache, in allocated bytes."""
    store_faults: str = ""
    """Store-side latency/throttle injection for the memory server's GETs (``CRYOBOX_STORE_FAULTS``)."""
    naive_memory: bool = False
    """Memory server without single-flight and chunk cache (the comparison baseline of ``bench burst``)."""
    fetch_deadline_s: float | None = None
    prefetch: bool = True
    """Replay an image's prefetch trace on its first lazy restore."""
