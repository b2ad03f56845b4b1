"""What the chunk resolver works on: a memory image in the store, its settings, and what it needs of a store
and a cache (protocols, so fakes and the real classes both fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ...errors import InvalidArgument
from .chunkcache import cache_identity
from .chunkfmt import ChunkIndex


class RangeReader(Protocol):
    """What the resolver needs of an object store (:class:`~cryobox.agent.store.objstore.ObjectStore` fits)."""

    @property
    def url(self) -> str: ...

    def get_range(self, key: str, start: int, length: int) -> bytes: ...


class ChunkCacheLike(Protocol):
    """What the resolver needs of a chunk cache (:class:`~cryobox.agent.store.chunkcache.ChunkCache` fits)."""

    def get(self, identity: str, idx: int, sha256: str) -> bytes | None: ...

    def put(self, identity: str, idx: int, data: bytes) -> None: ...

    def contains(self, identity: str, idx: int) -> bool: ...

    @property
    def used_bytes(self) -> int: ...


@dataclass(frozen=True)
class ImageRef:
    """One memory image in the store."""

    key: str  # store key of memory.pack
    index: ChunkIndex
    identity: str  # cache_identity(store.url, key, index.generation)

    @classmethod
    def for_store(cls, store: RangeReader, key: str, index: ChunkIndex) -> ImageRef:
        """The image ``key`` of ``store`` described by ``index``, with its cache identity computed."""
        return cls(key=key, index=index, identity=cache_identity(store.url, key, index.generation))


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
