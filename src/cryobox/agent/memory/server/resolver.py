"""The chunk resolver: turns reads of a memory image into chunks from the cache or the object store.

A read of ``[offset, offset + size)`` is split into the chunks it covers; each one is resolved by the first rule that
applies:

1. a **zero chunk** (bit set in the index's bitmap) is served as zeros, never fetched;
2. a **cache hit** (the optional in-memory hot set, then the host's durable :class:`ChunkCache`, both keyed by the
   chunk's sha256, so a chunk any image brought in serves every image that shares it) is served locally;
3. otherwise a **single-flight fetch**: the first caller for the chunk's sha256 (from any image) becomes the leader
   and GETs its object ``chunks/<sha[:2]>/<sha>``, verifies its sha256, puts it in the cache and hands the bytes to
   every caller that joined meanwhile. However many readers and prefetchers ask, the store sees one GET (plus
   retries).

Retries: :class:`StoreThrottled` / :class:`StoreError` answers, short reads and sha256 mismatches are retried with
exponential backoff and full jitter (``sleep(uniform(0, min(max, base * 2**retry)))``), bounded by
``retries`` *and* by a per-fetch deadline; :class:`ObjectNotFound` is final. When the fetch fails, the leader and
every waiter get a :class:`ChunkFetchFailed` naming the key, the chunk, the attempts and the last error, and the
failure is kept, dated, for :meth:`ChunkResolver.last_failure` (:mod:`.failures`). A waiter never waits longer
than its own deadline, even if the leader's GET hangs, so a vCPU faulting on a missing chunk fails loudly.

Concurrency: one lock guards the in-flight table and the small bookkeeping sets; it is never held across I/O.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Final

from ....errors import ChunkFetchFailed, CryoboxError, InvalidArgument
from .chunkfetch import Timing, check_idx, fetch_chunk, wait_failure
from .chunkref import ChunkCacheLike, ImageRef, RangeReader, ResolverConfig
from .failures import FailureLog, boot_clock
from .metrics import MemoryMetrics

__all__ = ["ChunkCacheLike", "ChunkResolver", "ImageRef", "RangeReader", "ResolverConfig"]

log = logging.getLogger(__name__)

_WAIT_SLICE_S: Final = 0.05  # waiters re-check the (injectable) clock this often while the leader fetches


class _Flight:
    """One in-flight fetch of a chunk (by sha256): the leader fills ``future``; waiters block on it."""

    __slots__ = ("future", "waiters", "prefetch", "attempts", "last_error")

    def __init__(self, prefetch: bool) -> None:
        self.future: Future[bytes] = Future()
        self.waiters = 0
        self.prefetch = prefetch
        self.attempts = 0
        self.last_error = ""


class ChunkResolver:
    """Serves reads of memory images chunk by chunk; thread-safe (FUSE threads and prefetch threads)."""

    def __init__(
        self,
        store: RangeReader,
        cache: ChunkCacheLike | None,
        config: ResolverConfig,
        metrics: MemoryMetrics,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        stamp: Callable[[], float] = boot_clock,  # dates failure records (a clock the agent can compare with)
    ) -> None:
        self._store = store
        self._cache = cache if config.use_cache else None
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._timing = Timing(clock, sleep, rng if rng is not None else random.Random())
        self._lock = threading.Lock()
        self._inflight: dict[str, _Flight] = {}  # by sha256
        self._hot: OrderedDict[str, bytes] = OrderedDict()  # by sha256
        self._touched: dict[str, dict[int, None]] = {}  # per image, in first-read order
        self._prefetched: dict[str, set[int]] = {}
        self._failures = FailureLog[ChunkFetchFailed](stamp)
        self._prefetch_stops: dict[str, set[threading.Event]] = {}
        if self._cache is not None:
            self._update_cache_gauge()

    @property
    def config(self) -> ResolverConfig:
        return self._config

    # -- reads --------------------------------------------------------------------------------------------------

    def read(self, image: ImageRef, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of the image, clamped at its end; one fault however many chunks."""
        if offset < 0 or size < 0:
            raise InvalidArgument(f"bad read of {image.key!r}: offset={offset} size={size}")
        self._metrics.faults.inc()
        index = image.index
        end = min(offset + size, index.image_size)
        if offset >= end:
            return b""
        cs = index.chunk_size
        parts: list[bytes | memoryview] = []
        from_prefetch = False
        for idx in range(offset // cs, (end - 1) // cs + 1):
            base = idx * cs
            lo, hi = max(offset, base) - base, min(end, base + index.chunk_len(idx)) - base
            if index.is_zero(idx):
                self._metrics.zero_fills.inc()
                parts.append(bytes(hi - lo))
            else:
                data, prefetched = self._resolve(image, idx, prefetch=False)
                from_prefetch = from_prefetch or prefetched
                parts.append(data if (lo, hi) == (0, len(data)) else memoryview(data)[lo:hi])
            with self._lock:
                self._touched.setdefault(image.identity, {}).setdefault(idx)
        if from_prefetch:
            self._metrics.prefetch_hits.inc()
        only = parts[0]
        return only if len(parts) == 1 and isinstance(only, bytes) else b"".join(parts)

    def chunk(self, image: ImageRef, idx: int, *, prefetch: bool = False) -> bytes:
        """The whole chunk ``idx`` (zeros for a zero chunk); fetched at most once at a time per host."""
        check_idx(image, idx)
        if image.index.is_zero(idx):
            if not prefetch:
                self._metrics.zero_fills.inc()
            return bytes(image.index.chunk_len(idx))
        return self._resolve(image, idx, prefetch=prefetch)[0]

    # -- prefetch -----------------------------------------------------------------------------------------------

    def prefetch(self, image: ImageRef, order: Sequence[int], workers: int = 2) -> threading.Thread:
        """Fetch ``order`` in the background (``workers`` at a time, started in order); skips zero/cached chunks.

        Stops at the first failure (kept in :meth:`last_failure`) or when :meth:`stop_prefetch` is called. The
        returned thread (already started, daemon) ends when every worker has. Without ``use_cache`` nothing fetched
        would be kept, so prefetch does nothing.
        """
        if workers < 1:
            raise InvalidArgument(f"prefetch workers must be >= 1, got {workers}")
        for idx in order:
            check_idx(image, idx)
        todo = [idx for idx in dict.fromkeys(order) if not image.index.is_zero(idx)] if self._config.use_cache else []
        stop = threading.Event()
        with self._lock:
            self._prefetch_stops.setdefault(image.identity, set()).add(stop)
        thread = threading.Thread(
            target=self._run_prefetch,
            args=(image, iter(todo), workers, stop),
            name=f"prefetch-{image.identity[:8]}",
            daemon=True,
        )
        thread.start()
        return thread

    def stop_prefetch(self, identity: str | None = None) -> None:
        """Ask the prefetches of ``identity`` (all of them when ``None``) to stop after their current chunk."""
        with self._lock:
            if identity is None:
                stops = [s for group in self._prefetch_stops.values() for s in group]
            else:
                stops = list(self._prefetch_stops.get(identity, ()))
        for stop in stops:
            stop.set()

    def _run_prefetch(self, image: ImageRef, todo: Iterator[int], workers: int, stop: threading.Event) -> None:
        next_lock = threading.Lock()

        def work() -> None:
            while not stop.is_set():
                with next_lock:
                    idx = next(todo, None)
                if idx is None:
                    return
                if self._is_cached(image.index.sha256[idx]):
                    continue
                try:
                    self.chunk(image, idx, prefetch=True)
                except Exception as err:  # a worker thread must not die with an unhandled exception
                    if not isinstance(err, CryoboxError):
                        log.exception("prefetch of %s: unexpected error at chunk %d", image.key, idx)
                    log.warning("prefetch of %s stopped at chunk %d: %s", image.key, idx, err)
                    stop.set()
                    return

        try:
            threads = [
                threading.Thread(target=work, name=f"prefetch-{image.identity[:8]}-{n}", daemon=True)
                for n in range(workers - 1)
            ]
            for t in threads:
                t.start()
            work()
            for t in threads:
                t.join()
        finally:
            with self._lock:
                group = self._prefetch_stops.get(image.identity)
                if group is not None:
                    group.discard(stop)
                    if not group:
                        del self._prefetch_stops[image.identity]

    # -- introspection ------------------------------------------------------------------------------------------

    def last_failure(self, identity: str, since: float | None = None) -> ChunkFetchFailed | None:
        """The most recent fetch failure for the image ``identity``, if it was recorded at or after ``since`` (by
        the ``stamp`` clock) and no fetch of the image that began after it has succeeded since."""
        record = self._failures.latest(identity, since)
        return None if record is None else record.error

    def touched(self, identity: str) -> set[int]:
        """Chunk indexes served by :meth:`read` for this image so far, zero chunks included."""
        with self._lock:
            return set(self._touched.get(identity, ()))

    def first_reads(self, identity: str) -> list[int]:
        """The chunks :meth:`read` served for this image, in the order each was first read (a prefetch trace)."""
        with self._lock:
            return list(self._touched.get(identity, ()))

    def forget_reads(self, identity: str) -> None:
        """Start recording :meth:`first_reads` (and :meth:`touched`) of this image afresh."""
        with self._lock:
            self._touched.pop(identity, None)

    def in_flight(self) -> dict[str, int]:
        """Fetches in progress: ``chunk sha256 -> number of callers waiting on the leader``."""
        with self._lock:
            return {key: flight.waiters for key, flight in self._inflight.items()}

    def forget(self, identity: str) -> None:
        """Drop the bookkeeping (touched, prefetched, last failure) kept for ``identity`` (hot chunks are shared by
        every image holding them; they age out of the hot set)."""
        with self._lock:
            self._touched.pop(identity, None)
            self._prefetched.pop(identity, None)
            self._failures.forget(identity)

    # -- resolution ---------------------------------------------------------------------------------------------

    def _resolve(self, image: ImageRef, idx: int, *, prefetch: bool) -> tuple[bytes, bool]:
        """Chunk ``idx`` (not a zero chunk) and whether prefetch brought it in."""
        if self._config.use_cache:
            data = self._lookup(image, idx)
            if data is not None:
                return data, self._was_prefetched(image.identity, idx)
        if not self._config.single_flight:
            return self._fetch_and_keep(image, idx, prefetch, None), False

        key = image.index.sha256[idx]
        with self._lock:
            flight = self._inflight.get(key)
            leader = flight is None
            if flight is None:
                flight = self._inflight[key] = _Flight(prefetch)
            else:
                flight.waiters += 1
        if not leader:
            return self._wait(image, idx, flight), flight.prefetch

        try:
            # Another leader may have landed this chunk between our cache miss and taking the lock.
            data = self._lookup(image, idx) if self._config.use_cache else None
            prefetched = self._was_prefetched(image.identity, idx) if data is not None else prefetch
            if data is None:
                data = self._fetch_and_keep(image, idx, prefetch, flight)
        except BaseException as err:
            with self._lock:
                del self._inflight[key]
            flight.future.set_exception(err)
            raise
        with self._lock:
            del self._inflight[key]
        flight.future.set_result(data)
        return data, prefetched

    def _wait(self, image: ImageRef, idx: int, flight: _Flight) -> bytes:
        """Block on the leader's fetch for at most ``fetch_deadline_s`` (by the injected clock)."""
        deadline = self._clock() + self._config.fetch_deadline_s
        try:
            while True:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    waited = self._config.fetch_deadline_s
                    failure = wait_failure(image, idx, waited, flight.attempts, flight.last_error)
                    self._failures.record(image.identity, failure)
                    raise failure
                try:
                    return flight.future.result(timeout=min(remaining, _WAIT_SLICE_S))
                except TimeoutError:
                    continue
                except ChunkFetchFailed as err:  # the leader only fails this way; a fresh instance per waiter
                    failure = ChunkFetchFailed(err.message, details=dict(err.details))
                    self._failures.record(image.identity, failure)  # the leader may have read another image
                    raise failure from err
        finally:
            with self._lock:
                flight.waiters -= 1

    def _fetch_and_keep(self, image: ImageRef, idx: int, prefetch: bool, flight: _Flight | None) -> bytes:
        data = self._fetch(image, idx, prefetch, flight)
        if self._config.use_cache:
            self._keep_hot(image.index.sha256[idx], data)
            if self._cache is not None:
                try:
                    self._cache.put(image.index.sha256[idx], data)
                except Exception:  # the cache is an optimisation: serve the verified bytes anyway
                    log.exception("chunk cache put failed for %s chunk %d; serving uncached", image.key, idx)
                self._update_cache_gauge()
        if prefetch:
            with self._lock:
                self._prefetched.setdefault(image.identity, set()).add(idx)
        return data

    def _fetch(self, image: ImageRef, idx: int, prefetch: bool, flight: _Flight | None) -> bytes:
        """GET and verify chunk ``idx`` (:func:`fetch_chunk`); a failure is kept for :meth:`last_failure`."""

        def progress(attempts: int, last_error: str) -> None:
            if flight is not None:
                flight.attempts, flight.last_error = attempts, last_error

        mark = self._failures.mark()
        try:
            data = fetch_chunk(self._store, image, idx, self._config, self._metrics, self._timing, prefetch, progress)
        except ChunkFetchFailed as failure:
            self._failures.record(image.identity, failure)
            raise
        self._failures.succeeded(image.identity, mark)  # a failure recorded before this fetch began is stale
        return data

    # -- cache helpers ------------------------------------------------------------------------------------------

    def _lookup(self, image: ImageRef, idx: int) -> bytes | None:
        """The chunk from the hot set or the cache (counted as a cache hit), else ``None``."""
        key = image.index.sha256[idx]
        if self._config.hot_chunks:
            with self._lock:
                data = self._hot.get(key)
                if data is not None:
                    self._hot.move_to_end(key)
            if data is not None:
                self._metrics.cache_hits.inc()
                return data
        if self._cache is None:
            return None
        try:
            data = self._cache.get(key)
        except Exception:  # a broken cache read is a miss: the store still has the chunk
            log.exception("chunk cache get failed for %s chunk %d; treating as a miss", image.key, idx)
            return None
        if data is None:
            return None
        self._metrics.cache_hits.inc()
        self._keep_hot(key, data)
        return data

    def _keep_hot(self, sha256: str, data: bytes) -> None:
        limit = self._config.hot_chunks
        if not limit:
            return
        with self._lock:
            self._hot[sha256] = data
            self._hot.move_to_end(sha256)
            while len(self._hot) > limit:
                self._hot.popitem(last=False)

    def _is_cached(self, sha256: str) -> bool:
        if not self._config.use_cache:
            return False
        with self._lock:
            if sha256 in self._hot:
                return True
        if self._cache is None:
            return False
        try:
            return self._cache.contains(sha256)
        except Exception:
            log.exception("chunk cache contains failed for chunk %s", sha256)
            return False

    def _update_cache_gauge(self) -> None:
        if self._cache is None:
            return
        try:
            self._metrics.chunk_cache_bytes.set(self._cache.used_bytes)
        except Exception:
            log.exception("could not read the chunk cache size")

    # -- bookkeeping --------------------------------------------------------------------------------------------

    def _was_prefetched(self, identity: str, idx: int) -> bool:
        with self._lock:
            return idx in self._prefetched.get(identity, ())
