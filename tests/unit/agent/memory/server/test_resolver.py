"""The chunk resolver: single flight, zero chunks, cache hits, retries with backoff, deadlines, prefetch, metrics."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from cryobox.agent.memory.server.chunkcache import ChunkCache
from cryobox.agent.memory.server.chunkref import image_identity
from cryobox.agent.memory.server.fusefs import ImageTable
from cryobox.agent.memory.server.metrics import MemoryMetrics
from cryobox.agent.memory.server.resolver import ChunkResolver, ImageRef, ResolverConfig
from cryobox.errors import ChunkFetchFailed, InvalidArgument, ObjectNotFound, StoreError, StoreThrottled
from cryobox.objstore.chunkfmt import ChunkIndex, chunk_key
from cryobox.objstore.client import open_store
from tests.support.clock import FakeClock

CS = 64  # tiny chunks keep the tests fast; the resolver does not care about the size
KEY = "templates/py/g1/memory.idx"
JOIN_S = 10.0


# -- fakes ----------------------------------------------------------------------------------------------------------


class FakeStore:
    """In-memory range reader of chunk objects that counts GETs and can hold, fail or corrupt them. A GET is
    told apart by its chunk's position in ``image`` (``idx * CS`` of the first chunk holding it): ``starts()``."""

    url = "memory://test"

    def __init__(self, objects: dict[str, bytes], image: ImageRef | None = None) -> None:
        self.objects = dict(objects)
        self.where: dict[str, int] = {}
        if image is not None:
            for i in reversed(range(image.index.chunk_count)):
                if not image.index.is_zero(i):
                    self.where[image.index.key(i)] = i * CS
        self.calls: list[tuple[str, int, int]] = []
        self.hold: dict[int, threading.Event] = {}  # chunk position -> GETs of it block until set
        self.gate: threading.Event | None = None  # every GET blocks until set
        self.fail: Callable[[int, int], BaseException | None] | None = None  # (call number, start) -> error
        self.on_get: Callable[[], None] | None = None
        self.corrupt = False
        self._lock = threading.Lock()

    @property
    def gets(self) -> int:
        with self._lock:
            return len(self.calls)

    def starts(self) -> list[int]:
        """The position (``idx * CS``) of the chunk every GET asked for, in order."""
        with self._lock:
            return [self.where.get(key, -1) for key, _, _ in self.calls]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._lock:
            self.calls.append((key, start, length))
            n = len(self.calls)
        if self.on_get is not None:
            self.on_get()
        position = self.where.get(key, -1)
        for event in (self.gate, self.hold.get(position)):
            if event is not None and not event.wait(JOIN_S):
                raise StoreError("test gate never opened")
        err = self.fail(n, position) if self.fail is not None else None
        if err is not None:
            raise err
        if key not in self.objects:
            raise ObjectNotFound(f"no such key {key!r}")
        data = self.objects[key][start : start + length]
        return bytes([data[0] ^ 0xFF]) + data[1:] if self.corrupt else data


class FakeCache:
    """Dict-backed chunk cache by sha256 that verifies on get, like the real one."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.gets = 0
        self.puts = 0
        self.fail_puts = False
        self._lock = threading.Lock()

    def get(self, sha256: str) -> bytes | None:
        with self._lock:
            self.gets += 1
            data = self.data.get(sha256)
            if data is not None and hashlib.sha256(data).hexdigest() != sha256:
                del self.data[sha256]
                return None
            return data

    def put(self, sha256: str, data: bytes) -> None:
        if self.fail_puts:
            raise OSError(28, "No space left on device")
        with self._lock:
            self.puts += 1
            self.data[sha256] = data

    def contains(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self.data

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(len(d) for d in self.data.values())


# -- helpers --------------------------------------------------------------------------------------------------------


def build(chunks: Sequence[bytes], *, key: str = KEY, generation: str = "g1") -> tuple[ImageRef, dict[str, bytes]]:
    """An image of ``chunks`` (all-zero ones become zero chunks) and its chunk objects (key -> bytes)."""
    zero = bytearray((len(chunks) + 7) // 8)
    sha: list[str] = []
    objects: dict[str, bytes] = {}
    for i, chunk in enumerate(chunks):
        if not any(chunk):
            zero[i >> 3] |= 1 << (i & 7)
            sha.append("")
        else:
            sha.append(hashlib.sha256(chunk).hexdigest())
            objects[chunk_key(sha[-1])] = chunk
    index = ChunkIndex(sum(map(len, chunks)), CS, generation, bytes(zero), tuple(sha))
    return ImageRef(key=key, index=index, identity=f"id-{generation}"), objects


def data_chunk(seed: int, size: int = CS) -> bytes:
    return random.Random(seed).randbytes(size).replace(b"\0", b"\1")


def setup(
    chunks: Sequence[bytes], config: ResolverConfig | None = None, cache: FakeCache | None = None
) -> tuple[ChunkResolver, ImageRef, FakeStore, FakeClock, MemoryMetrics]:
    image, objects = build(chunks)
    store, clock, metrics = FakeStore(objects, image), FakeClock(1000.0), MemoryMetrics()
    resolver = ChunkResolver(
        store, cache, config or ResolverConfig(), metrics, clock=clock, sleep=clock.sleep, rng=random.Random(7)
    )
    return resolver, image, store, clock, metrics


def run_threads(n: int, fn: Callable[[], bytes]) -> tuple[list[threading.Thread], list[bytes | BaseException]]:
    """Start ``n`` threads calling ``fn`` together; results (or exceptions) land in the returned list."""
    results: list[bytes | BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def body() -> None:
        barrier.wait()
        try:
            out: bytes | BaseException = fn()
        except BaseException as err:
            out = err
        with lock:
            results.append(out)

    threads = [threading.Thread(target=body, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, results


def join_all(threads: Sequence[threading.Thread]) -> None:
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), "thread did not finish"


def wait_until(predicate: Callable[[], bool], timeout_s: float = JOIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.002)


def snap(metrics: MemoryMetrics) -> dict[str, float]:
    return metrics.snapshot()


# -- single flight --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_cache", [True, False], ids=["cache", "no-cache"])
def test_sixteen_readers_of_one_missing_chunk_cause_one_get(with_cache: bool) -> None:
    chunks = [data_chunk(0), data_chunk(1), data_chunk(2)]
    cache = FakeCache() if with_cache else None
    resolver, image, store, _, metrics = setup(chunks, cache=cache)
    store.gate = threading.Event()

    threads, results = run_threads(16, lambda: resolver.read(image, CS + 8, 16))
    wait_until(lambda: store.gets == 1 and resolver.in_flight() == {image.index.sha256[1]: 15})
    store.gate.set()
    join_all(threads)

    assert results == [chunks[1][8:24]] * 16
    assert store.gets == 1
    assert resolver.in_flight() == {}
    s = snap(metrics)
    assert (s["faults"], s["chunk_fetches"], s["store_gets"], s["cache_hits"]) == (16, 1, 1, 0)
    assert resolver.touched(image.identity) == {1}
    if cache is not None:
        assert cache.puts == 1
        assert resolver.read(image, CS, CS) == chunks[1]  # now a cache hit
        assert store.gets == 1
        assert snap(metrics)["cache_hits"] == 1
        assert snap(metrics)["cache_bytes"] == CS


def test_readers_of_two_images_sharing_a_chunk_cause_one_get() -> None:
    """A template and its snapshot hold the same bytes in chunk 1: one flight, one GET, one cached chunk."""
    shared = data_chunk(1)
    template, objects = build([data_chunk(0), shared], generation="g1")
    snapshot, more = build([data_chunk(9), shared, data_chunk(2)], key="snapshots/s1/memory.idx", generation="s1")
    cache = FakeCache()
    store, metrics = FakeStore({**objects, **more}, template), MemoryMetrics()
    resolver = ChunkResolver(store, cache, ResolverConfig(), metrics)
    store.gate = threading.Event()

    readers = [template, snapshot] * 8
    threads, results = run_threads(16, lambda: resolver.read(readers.pop(), CS + 8, 16))
    wait_until(lambda: store.gets == 1 and resolver.in_flight() == {template.index.sha256[1]: 15})
    store.gate.set()
    join_all(threads)

    assert results == [shared[8:24]] * 16 and store.gets == 1 and cache.puts == 1
    assert resolver.touched(template.identity) == {1} == resolver.touched(snapshot.identity)
    assert resolver.read(snapshot, CS, CS) == shared and store.gets == 1  # a cache hit for the other image


def test_a_failed_shared_fetch_is_recorded_for_the_waiting_image_too() -> None:
    """The leader read the template; a snapshot's reader waited on it: each image's VM is explained by it."""
    shared = data_chunk(1)
    template, objects = build([shared], generation="g1")
    snapshot, _ = build([shared], key="snapshots/s1/memory.idx", generation="s1")
    store, clock = FakeStore(objects, template), FakeClock(1000.0)
    resolver = ChunkResolver(
        store, FakeCache(), ResolverConfig(retries=0), MemoryMetrics(), clock=clock, sleep=clock.sleep
    )
    store.gate = threading.Event()
    store.fail = lambda _n, _start: StoreError("boom")
    leader, _ = run_threads(1, lambda: resolver.read(template, 0, 8))
    wait_until(lambda: store.gets == 1)
    waiter, _ = run_threads(1, lambda: resolver.read(snapshot, 0, 8))
    wait_until(lambda: resolver.in_flight() == {shared_sha(shared): 1})
    store.gate.set()
    join_all([*leader, *waiter])
    assert isinstance(resolver.last_failure(template.identity), ChunkFetchFailed)
    assert isinstance(resolver.last_failure(snapshot.identity), ChunkFetchFailed)


def shared_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_naive_mode_every_reader_fetches() -> None:
    cache = FakeCache()
    resolver, image, store, _, metrics = setup([data_chunk(0), data_chunk(1)], ResolverConfig.naive(), cache)
    store.gate = threading.Event()

    threads, results = run_threads(16, lambda: resolver.read(image, 0, 32))
    wait_until(lambda: store.gets == 16)  # nobody waits for anybody: all 16 are in the store at once
    store.gate.set()
    join_all(threads)

    assert len(results) == 16 and all(r == image_bytes(image, store)[:32] for r in results)
    for _ in range(4):
        resolver.read(image, 0, 32)
    assert store.gets == 20
    join_all([resolver.prefetch(image, [0, 1])])  # nothing would be kept: prefetch is a no-op
    assert store.gets == 20
    assert cache.puts == 0 and cache.gets == 0
    s = snap(metrics)
    assert (s["faults"], s["chunk_fetches"], s["store_gets"], s["cache_hits"]) == (20, 20, 20, 0)


def image_bytes(image: ImageRef, store: FakeStore) -> bytes:
    """The raw image rebuilt from the store's chunk objects (zero chunks as zeros)."""
    out = bytearray()
    for i in range(image.index.chunk_count):
        n = image.index.chunk_len(i)
        out += bytes(n) if image.index.is_zero(i) else store.objects[image.index.key(i)]
    return bytes(out)


# -- zero chunks, cache hits, spans, EOF ----------------------------------------------------------------------------


def test_zero_chunks_are_served_without_a_get() -> None:
    chunks = [bytes(CS), data_chunk(1), bytes(CS // 2)]  # the last (short) chunk is zero too
    resolver, image, store, _, metrics = setup(chunks, cache=FakeCache())

    assert resolver.read(image, 0, CS) == bytes(CS)
    assert resolver.read(image, 2 * CS, 100) == bytes(CS // 2)  # clamped at EOF
    assert resolver.chunk(image, 0) == bytes(CS)
    assert store.gets == 0
    s = snap(metrics)
    assert (s["faults"], s["zero_fills"], s["chunk_fetches"]) == (2, 3, 0)

    assert resolver.read(image, CS - 4, CS + 8) == bytes(4) + chunks[1] + bytes(4)
    assert store.gets == 1
    assert resolver.touched(image.identity) == {0, 1, 2}


def test_cache_hit_does_not_touch_the_store() -> None:
    chunks = [data_chunk(0), data_chunk(1)]
    cache = FakeCache()
    resolver, image, store, _, metrics = setup(chunks, cache=cache)
    cache.put(image.index.sha256[1], chunks[1])

    assert resolver.read(image, CS, CS) == chunks[1]
    assert resolver.chunk(image, 1) == chunks[1]
    assert store.gets == 0
    s = snap(metrics)
    assert (s["cache_hits"], s["chunk_fetches"], s["store_gets"]) == (2, 0, 0)


def test_corrupt_cache_entry_is_refetched() -> None:
    chunks = [data_chunk(0)]
    cache = FakeCache()
    resolver, image, store, _, _ = setup(chunks, cache=cache)
    cache.data[image.index.sha256[0]] = b"x" * CS  # wrong bytes: the cache's sha256 check rejects them

    assert resolver.read(image, 0, CS) == chunks[0]
    assert store.gets == 1
    assert cache.data[image.index.sha256[0]] == chunks[0]


def test_read_spanning_two_chunks() -> None:
    chunks = [data_chunk(0), data_chunk(1), data_chunk(2)]
    resolver, image, store, _, metrics = setup(chunks, cache=FakeCache())

    assert resolver.read(image, CS // 2, CS) == chunks[0][CS // 2 :] + chunks[1][: CS // 2]
    assert sorted(store.starts()) == [0, CS]
    assert resolver.touched(image.identity) == {0, 1}
    s = snap(metrics)
    assert (s["faults"], s["chunk_fetches"]) == (1, 2)


def test_read_clamps_at_end_of_image() -> None:
    chunks = [data_chunk(0), data_chunk(1, size=CS // 4)]  # short last chunk
    resolver, image, store, _, metrics = setup(chunks)
    size = image.index.image_size

    assert resolver.read(image, size - 10, 4096) == chunks[1][-10:]
    assert store.calls == [(image.index.key(1), 0, CS // 4)]  # the GET asks for exactly the short chunk
    assert resolver.read(image, size, 10) == b""
    assert resolver.read(image, size + 100, 10) == b""
    assert resolver.read(image, 0, 0) == b""
    assert snap(metrics)["faults"] == 4
    with pytest.raises(InvalidArgument):
        resolver.read(image, -1, 10)
    with pytest.raises(InvalidArgument):
        resolver.chunk(image, 2)


# -- failures, retries, deadlines -----------------------------------------------------------------------------------


def test_corrupt_store_bytes_are_retried_then_fail_loudly() -> None:
    chunks = [data_chunk(0), data_chunk(1)]
    cache = FakeCache()
    config = ResolverConfig(retries=3)
    resolver, image, store, clock, metrics = setup(chunks, config, cache)
    store.corrupt = True

    with pytest.raises(ChunkFetchFailed) as info:
        resolver.read(image, CS, 10)
    err = info.value
    assert store.gets == 4 and len(clock.sleeps) == 3
    assert KEY in err.message and "chunk 1" in err.message and "4 attempt(s)" in err.message
    assert "sha256 mismatch" in err.message
    assert err.details["chunk"] == 1 and err.details["attempts"] == 4 and err.details["key"] == KEY
    assert resolver.last_failure(image.identity) is err
    assert cache.puts == 0 and resolver.touched(image.identity) == set()
    s = snap(metrics)
    assert (s["fetch_failures"], s["chunk_fetches"], s["store_gets"]) == (1, 0, 4)

    store.corrupt = False  # a failure is not sticky: the next read fetches again
    assert resolver.read(image, CS, 10) == chunks[1][:10]


def test_retry_after_throttling_then_success() -> None:
    chunks = [data_chunk(0)]
    resolver, image, store, clock, metrics = setup(chunks, cache=FakeCache())
    store.fail = lambda n, _start: StoreThrottled("SlowDown") if n <= 2 else None

    assert resolver.read(image, 0, CS) == chunks[0]
    assert store.gets == 3 and len(clock.sleeps) == 2
    s = snap(metrics)
    assert (s["chunk_fetches"], s["store_gets"], s["fetch_failures"]) == (1, 3, 0)
    assert metrics.registry.get_sample_value("chunk_fetch_seconds_count") == 1
    assert resolver.last_failure(image.identity) is None


def test_throttled_store_fails_every_waiter_after_bounded_backoff() -> None:
    chunks = [data_chunk(0), data_chunk(1)]
    config = ResolverConfig(retries=4, backoff_base_s=0.05, backoff_max_s=0.15, fetch_deadline_s=15.0)
    resolver, image, store, clock, metrics = setup(chunks, config, FakeCache())
    store.gate = threading.Event()
    store.fail = lambda _n, _start: StoreThrottled("503 SlowDown")

    threads, results = run_threads(16, lambda: resolver.read(image, 0, 8))
    wait_until(lambda: resolver.in_flight() == {image.index.sha256[0]: 15})
    store.gate.set()
    join_all(threads)

    assert len(results) == 16
    assert all(isinstance(r, ChunkFetchFailed) for r in results)
    assert len({id(r) for r in results}) == 16  # each waiter raises its own instance...
    messages = {str(r) for r in results}
    assert len(messages) == 1  # ...with the same story
    (message,) = messages
    assert "chunk 0" in message and "5 attempt(s)" in message and "StoreThrottled: 503 SlowDown" in message
    assert store.gets == 5  # one fetch (1 + 4 retries) for all 16 readers
    assert len(clock.sleeps) == 4
    for retry, slept in enumerate(clock.sleeps):
        assert 0 <= slept <= min(0.15, 0.05 * 2**retry)
    assert sum(clock.sleeps) < config.fetch_deadline_s
    s = snap(metrics)
    assert (s["fetch_failures"], s["store_gets"], s["faults"]) == (1, 5, 16)
    assert isinstance(resolver.last_failure(image.identity), ChunkFetchFailed)


def test_backoff_is_cut_short_by_the_deadline() -> None:
    config = ResolverConfig(retries=1000, backoff_base_s=0.5, backoff_max_s=0.5, fetch_deadline_s=2.0)
    resolver, image, store, clock, _ = setup([data_chunk(0)], config)
    store.on_get = lambda: clock.advance(0.1)  # every GET takes 100 ms
    store.fail = lambda _n, _start: StoreError("500 InternalError")
    started = clock()

    with pytest.raises(ChunkFetchFailed, match="deadline") as info:
        resolver.chunk(image, 0)
    assert clock() - started <= config.fetch_deadline_s
    assert 3 <= store.gets < 1000
    assert info.value.details["reason"] == "deadline"
    assert isinstance(info.value.__cause__, StoreError)


def test_a_get_slower_than_the_deadline_is_not_retried() -> None:
    resolver, image, store, clock, _ = setup([data_chunk(0)], ResolverConfig(fetch_deadline_s=15.0))
    store.on_get = lambda: clock.advance(20.0)
    store.fail = lambda _n, _start: StoreError("timed out")

    with pytest.raises(ChunkFetchFailed, match="1 attempt"):
        resolver.chunk(image, 0)
    assert store.gets == 1 and clock.sleeps == []


def test_waiters_give_up_at_their_deadline_when_the_leader_hangs() -> None:
    chunks = [data_chunk(0)]
    resolver, image, store, clock, _ = setup(chunks, ResolverConfig(fetch_deadline_s=15.0), FakeCache())
    store.gate = threading.Event()
    leader_threads, leader_results = run_threads(1, lambda: resolver.read(image, 0, CS))
    wait_until(lambda: store.gets == 1)
    waiter_threads, waiter_results = run_threads(1, lambda: resolver.read(image, 0, CS))
    wait_until(lambda: resolver.in_flight() == {image.index.sha256[0]: 1})

    clock.advance(16.0)  # the injected clock passes the waiter's deadline; the leader is still in its GET
    join_all(waiter_threads)
    (failure,) = waiter_results
    assert isinstance(failure, ChunkFetchFailed) and "waiting 15s" in str(failure)
    assert resolver.last_failure(image.identity) is failure

    store.gate.set()  # the leader's GET finally answers; it still serves (and caches) the chunk
    join_all(leader_threads)
    assert leader_results == [chunks[0]]
    assert store.gets == 1


def test_missing_object_is_not_retried() -> None:
    resolver, image, store, clock, _ = setup([data_chunk(0)])
    del store.objects[image.index.key(0)]

    with pytest.raises(ChunkFetchFailed, match="object not found") as info:
        resolver.read(image, 0, 1)
    assert store.gets == 1 and clock.sleeps == []
    assert isinstance(info.value.__cause__, ObjectNotFound)


def test_cache_put_failure_still_serves_the_chunk() -> None:
    chunks = [data_chunk(0)]
    cache = FakeCache()
    cache.fail_puts = True
    resolver, image, _, _, _ = setup(chunks, cache=cache)
    assert resolver.read(image, 0, CS) == chunks[0]


# -- prefetch -------------------------------------------------------------------------------------------------------


def test_prefetch_fetches_in_order_and_a_concurrent_read_waits_for_it() -> None:
    chunks = [data_chunk(i) if i != 2 else bytes(CS) for i in range(6)]
    resolver, image, store, _, metrics = setup(chunks, cache=FakeCache())
    start_of = {i: i * CS for i in range(6) if i != 2}
    store.hold[start_of[3]] = held = threading.Event()

    thread = resolver.prefetch(image, [4, 2, 0, 3, 5, 1], workers=1)
    wait_until(lambda: image.index.sha256[3] in resolver.in_flight())
    readers, results = run_threads(1, lambda: resolver.read(image, 3 * CS + 1, 2))
    wait_until(lambda: resolver.in_flight() == {image.index.sha256[3]: 1})
    held.set()
    join_all([thread, *readers])

    assert results == [chunks[3][1:3]]
    assert store.starts() == [start_of[i] for i in (4, 0, 3, 5, 1)]  # in order, zero chunk 2 skipped, 3 once
    s = snap(metrics)
    assert (s["prefetch_chunks"], s["chunk_fetches"], s["store_gets"]) == (5, 5, 5)
    assert (s["faults"], s["prefetch_hits"]) == (1, 1)

    assert resolver.read(image, 0, 4) == chunks[0][:4]  # a later cache hit on a prefetched chunk
    assert snap(metrics)["prefetch_hits"] == 2
    assert store.gets == 5


def test_prefetch_skips_cached_chunks_without_reading_them() -> None:
    chunks = [data_chunk(0), data_chunk(1), data_chunk(2)]
    cache = FakeCache()
    resolver, image, store, _, _ = setup(chunks, cache=cache)
    cache.put(image.index.sha256[1], chunks[1])

    join_all([resolver.prefetch(image, [1, 0, 2], workers=2)])
    assert sorted(store.starts()) == [0, 2 * CS]
    assert cache.gets == 4  # chunks 0 and 2: the miss and the leader's re-check; chunk 1 only via contains()


def test_prefetch_stops_at_the_first_failure() -> None:
    chunks = [data_chunk(i) for i in range(4)]
    resolver, image, store, _, _ = setup(chunks, ResolverConfig(retries=0))
    store.fail = lambda _n, start: StoreError("boom") if start == CS else None

    join_all([resolver.prefetch(image, [0, 1, 2, 3], workers=1)])
    assert store.starts() == [0, CS]
    failure = resolver.last_failure(image.identity)
    assert failure is not None and "chunk 1" in failure.message


def test_stop_prefetch() -> None:
    chunks = [data_chunk(i) for i in range(6)]
    resolver, image, store, _, _ = setup(chunks)
    store.hold[0] = held = threading.Event()

    thread = resolver.prefetch(image, range(6), workers=1)
    wait_until(lambda: store.gets == 1)
    resolver.stop_prefetch(image.identity)
    held.set()
    join_all([thread])
    assert store.starts() == [0]


def test_prefetch_rejects_bad_arguments() -> None:
    resolver, image, _, _, _ = setup([data_chunk(0)])
    with pytest.raises(InvalidArgument):
        resolver.prefetch(image, [0], workers=0)
    with pytest.raises(InvalidArgument):
        resolver.prefetch(image, [0, 1])


# -- hot set, config, metrics, the real cache -----------------------------------------------------------------------


def test_hot_chunks_spare_the_cache_reads() -> None:
    chunks = [data_chunk(i) for i in range(3)]
    cache = FakeCache()
    resolver, image, store, _, metrics = setup(chunks, ResolverConfig(hot_chunks=2), cache)

    for _ in range(3):
        assert resolver.read(image, 0, 8) == chunks[0][:8]
    assert (store.gets, cache.gets) == (1, 2)  # the miss and the re-check; then the hot set answers
    resolver.read(image, CS, 8)
    resolver.read(image, 2 * CS, 8)  # evicts chunk 0 from the hot set (LRU of 2)
    gets_before = cache.gets
    assert resolver.read(image, 0, 8) == chunks[0][:8]
    assert cache.gets == gets_before + 1 and store.gets == 3
    assert snap(metrics)["cache_hits"] == 3


def test_config_validation() -> None:
    for bad in (
        {"retries": -1},
        {"hot_chunks": -1},
        {"backoff_base_s": -0.1},
        {"fetch_deadline_s": 0.0},
    ):
        with pytest.raises(InvalidArgument):
            ResolverConfig(**bad)
    naive = ResolverConfig.naive()
    assert (naive.single_flight, naive.use_cache) == (False, False)


def test_metrics_names_and_private_registries() -> None:
    first, second = MemoryMetrics(), MemoryMetrics()  # a shared registry would raise "Duplicated timeseries"
    first.faults.inc()
    text = first.render()[0].decode()
    for name in (
        "faults_total",
        "chunk_fetches_total",
        "zero_fills_total",
        "cache_hits_total",
        "chunk_fetch_seconds_bucket",
        "chunk_cache_bytes",
        "prefetch_hits_total",
        "chunk_fetch_failures_total",
        "store_gets_total",
        "prefetch_chunks_total",
    ):
        assert f"\n{name}" in text, name
    assert 'chunk_fetch_seconds_bucket{le="0.001"}' in text and 'chunk_fetch_seconds_bucket{le="30.0"}' in text
    assert first.snapshot()["faults"] == 1 and second.snapshot()["faults"] == 0
    assert set(first.snapshot()) >= {
        "faults",
        "chunk_fetches",
        "zero_fills",
        "cache_hits",
        "prefetch_hits",
        "store_gets",
        "fetch_failures",
        "cache_bytes",
    }
    assert REGISTRY.get_sample_value("faults_total") is None


def test_with_the_real_chunk_cache(tmp_path: Path) -> None:
    chunks = [data_chunk(0), bytes(CS), data_chunk(2)]
    built, objects = build(chunks)
    store = FakeStore(objects, built)
    image = ImageRef.for_store(store, KEY, built.index)
    assert image.identity == image_identity(store.url, KEY, "g1")
    cache = ChunkCache(tmp_path / "cache", budget_bytes=1 << 20)
    cache.open()
    metrics = MemoryMetrics()
    resolver = ChunkResolver(store, cache, ResolverConfig(), metrics)

    assert resolver.read(image, 0, 3 * CS) == b"".join(chunks)
    assert store.gets == 2
    assert metrics.snapshot()["cache_bytes"] == cache.used_bytes > 0

    # a new resolver (an agent restart) over a reopened cache: everything is a hit
    reopened = ChunkCache(tmp_path / "cache", budget_bytes=1 << 20)
    reopened.open()
    again = ChunkResolver(store, reopened, ResolverConfig(), MemoryMetrics())
    assert again.read(image, 0, 3 * CS) == b"".join(chunks)
    assert store.gets == 2

    # a corrupted cached chunk is detected by the cache and refetched from the store
    path = tmp_path / "cache" / image.index.sha256[2][:2] / image.index.sha256[2]
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert again.read(image, 2 * CS, CS) == chunks[2]
    assert store.gets == 3


def test_with_a_real_memory_store() -> None:
    chunks = [data_chunk(0), bytes(CS), data_chunk(2), data_chunk(3, size=CS // 2)]
    built, objects = build(chunks)
    store = open_store("memory://")
    for key, data in objects.items():
        store.put(key, data)
    image = ImageRef.for_store(store, KEY, built.index)
    metrics = MemoryMetrics()
    resolver = ChunkResolver(store, FakeCache(), ResolverConfig(), metrics)

    threads, results = run_threads(8, lambda: resolver.read(image, 0, 4 * CS))
    join_all(threads)
    assert results == [b"".join(chunks)] * 8
    assert store.stats.gets == metrics.snapshot()["store_gets"] == 3  # one GET per non-zero chunk


# -- failure records: dated, cleared by a later success -------------------------------------------------------------


def test_a_failure_is_dated_and_cleared_by_a_later_successful_fetch_of_the_image() -> None:
    chunks = [data_chunk(0), data_chunk(1)]
    image, objects = build(chunks)
    store, clock, stamp = FakeStore(objects, image), FakeClock(1000.0), FakeClock(1000.0)
    resolver = ChunkResolver(
        store, FakeCache(), ResolverConfig(retries=0), MemoryMetrics(), clock=clock, sleep=clock.sleep, stamp=stamp
    )
    store.fail = lambda _n, start: StoreError("boom") if start == 0 else None
    stamp.now = 50.0
    with pytest.raises(ChunkFetchFailed):
        resolver.read(image, 0, 8)

    assert resolver.last_failure(image.identity) is not None
    assert resolver.last_failure(image.identity, since=50.0) is not None  # recorded at 50: a VM started then
    assert resolver.last_failure(image.identity, since=49.0) is not None
    assert resolver.last_failure(image.identity, since=50.5) is None  # a VM spawned later did not die of it

    stamp.now = 60.0
    assert resolver.read(image, CS, 8) == chunks[1][:8]  # another chunk of the image fetched fine afterwards
    assert resolver.last_failure(image.identity) is None
    assert resolver.last_failure(image.identity, since=0.0) is None


def test_a_success_already_under_way_when_the_failure_happened_does_not_clear_it() -> None:
    chunks = [data_chunk(0), data_chunk(1)]
    image, objects = build(chunks)
    store, clock = FakeStore(objects, image), FakeClock(1000.0)
    resolver = ChunkResolver(
        store, FakeCache(), ResolverConfig(retries=0), MemoryMetrics(), clock=clock, sleep=clock.sleep, stamp=clock
    )
    store.hold[CS] = held = threading.Event()  # the GET of chunk 1 is slow
    slow, slow_results = run_threads(1, lambda: resolver.read(image, CS, 8))
    wait_until(lambda: image.index.sha256[1] in resolver.in_flight())
    store.fail = lambda _n, start: StoreError("boom") if start == 0 else None
    with pytest.raises(ChunkFetchFailed) as info:
        resolver.read(image, 0, 8)
    held.set()
    join_all(slow)

    assert slow_results == [chunks[1][:8]]
    assert resolver.last_failure(image.identity) is info.value  # the slow success began before the failure


def test_an_index_load_failure_is_dated_too() -> None:
    store = open_store("memory://")
    stamp = FakeClock(1000.0)
    table = ImageTable(store, None, stamp)
    stamp.now = 10.0
    name = f"templates+base+g1@{'0' * 64}"
    with pytest.raises(ObjectNotFound):
        table.get(name)
    assert table.failure(name, since=9.0) is not None
    assert table.failure(name, since=11.0) is None
