"""What the chunk resolver works on: a memory image in the store, its settings, and what it needs of a store
and a cache (protocols, so fakes and the real classes both fit)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

from ....errors import InvalidArgument
from ....objstore.chunkfmt import ChunkIndex


def image_identity(store_url: str, key: str, generation: str) -> str:
    """sha256 hex[:32] of one image generation in one store (store URL, index key, generation): what the
    resolver's per-image bookkeeping (reads, prefetch, failures) is keyed by. Chunks are keyed by their sha256."""
    return hashlib.sha256(json.dumps([store_url, key, generation]).encode()).hexdigest()[:32]


class RangeReader(Protocol):
    """What the resolver needs of an object store (:class:`~cryobox.objstore.client.ObjectStore` fits)."""

    @property
    def url(self) -> str: ...

    def get_range(self, key: str, start: int, length: int) -> bytes: ...


class ChunkCacheLike(Protocol):
    """What the resolver needs of a chunk cache (:class:`~cryobox.agent.memory.server.chunkcache.ChunkCache` fits)."""

    def get(self, sha256: str) -> bytes | None: ...

    def put(self, sha256: str, data: bytes) -> None: ...

    def contains(self, sha256: str) -> bool: ...

    @property
    def used_bytes(self) -> int: ...


@dataclass(frozen=True)
class ImageRef:
    """One image in the store: its index (which names its chunk objects) and its identity."""

    key: str  # store key of the image's index (memory.idx): what errors name
    index: ChunkIndex
    identity: str  # image_identity(store.url, key, index.generation)

    @classmethod
    def for_store(cls, store: RangeReader, key: str, index: ChunkIndex) -> ImageRef:
        """The image indexed by ``key`` in ``store`` (``index``), with its identity computed."""
        return cls(key=key, index=index, identity=image_identity(store.url, key, index.generation))


@dataclass(frozen=True)
class ResolverConfig:
    single_flight: bool = True
    use_cache: bool = True
    retries: int = 4  # attempts after the first
    backoff_base_s: float = 0.05  # full jitter: sleep rng.uniform(0, min(max, base * 2**retry))
    backoff_max_s: float = 1.0
    fetch_deadline_s: float = 15.0  # whole fetch incl. retries; past it -> ChunkFetchFailed
    hot_chunks: int = 0  # verified chunks kept in memory (LRU) in front of the cache; 0 = off

    def __post_init__(self) -> None:
        if self.retries < 0 or self.hot_chunks < 0:
            raise InvalidArgument("retries and hot_chunks must be >= 0")
        if self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise InvalidArgument("backoff_base_s and backoff_max_s must be >= 0")
        if self.fetch_deadline_s <= 0:
            raise InvalidArgument("fetch_deadline_s must be > 0")

    @classmethod
    def naive(cls) -> ResolverConfig:
        """No single flight and no cache: every chunk request is its own fetch (the herd's worst case)."""
        return cls(single_flight=False, use_cache=False)
