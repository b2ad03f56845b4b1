"""Prometheus metrics of the memory server's chunk resolver, kept in a registry of their own.

The herd's health is the ratio ``chunk_fetches_total / faults_total``: every read the guest makes is a fault, and a
healthy host fetches each chunk from the store once however many guests fault on it. ``store_gets_total`` counts
every GET attempt including retries, so ``store_gets_total / chunk_fetches_total`` shows how hard the store pushed
back.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FETCH_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)

# snapshot() key -> exposed sample name
_SNAPSHOT_SAMPLES: Final = {
    "faults": "faults_total",
    "chunk_fetches": "chunk_fetches_total",
    "zero_fills": "zero_fills_total",
    "cache_hits": "cache_hits_total",
    "prefetch_hits": "prefetch_hits_total",
    "prefetch_chunks": "prefetch_chunks_total",
    "store_gets": "store_gets_total",
    "fetch_failures": "chunk_fetch_failures_total",
    "cache_bytes": "chunk_cache_bytes",
}


class MemoryMetrics:
    """The resolver's collectors, registered in ``registry`` (a fresh :class:`CollectorRegistry` by default).

    Counters are declared without the ``_total`` suffix; prometheus_client appends it, so the exposed names are
    ``faults_total``, ``chunk_fetches_total`` and so on.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.faults = Counter("faults", "Reads of memory images served (page faults reaching the resolver)", registry=r)
        self.chunk_fetches = Counter("chunk_fetches", "Chunks fetched from the object store and verified", registry=r)
        self.zero_fills = Counter("zero_fills", "Zero chunks served as zeros without a fetch", registry=r)
        self.cache_hits = Counter("cache_hits", "Chunks served from the local chunk cache", registry=r)
        self.chunk_fetch_seconds = Histogram(
            "chunk_fetch_seconds",
            "Time to fetch and verify one chunk, retries included (successful fetches)",
            buckets=FETCH_BUCKETS,
            registry=r,
        )
        self.chunk_cache_bytes = Gauge("chunk_cache_bytes", "Bytes allocated by the local chunk cache", registry=r)
        self.prefetch_hits = Counter("prefetch_hits", "Reads served by a chunk that prefetch brought in", registry=r)
        self.chunk_fetch_failures = Counter(
            "chunk_fetch_failures", "Chunk fetches that failed after their retries or deadline", registry=r
        )
        self.store_gets = Counter("store_gets", "GET attempts against the object store, retries included", registry=r)
        self.prefetch_chunks = Counter("prefetch_chunks", "Chunks fetched from the store by prefetch", registry=r)

    def snapshot(self) -> dict[str, float]:
        """Current values under plain keys (``faults``, ``chunk_fetches``, ``store_gets``, ...) for JSON output."""
        out: dict[str, float] = {}
        for key, sample in _SNAPSHOT_SAMPLES.items():
            value = self.registry.get_sample_value(sample)
            out[key] = 0.0 if value is None else value
        return out

    def render(self) -> tuple[bytes, str]:
        """The text exposition of this registry and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
