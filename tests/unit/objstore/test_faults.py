"""FaultyStore: latency, fair bandwidth sharing, concurrency cap, throttle / fail rates, and the spec text."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from cryobox.errors import InvalidArgument, StoreError, StoreThrottled
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.faults import ENV_VAR, FaultyStore, SharedLink, StoreFaults, with_faults
from tests.support.clock import FakeClock

MB = 1_000_000


class ScriptedRng(random.Random):
    """``random()`` answers from a script (then 0.99: no fault)."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0) if self.draws else 0.99


def memory_store(**objects: bytes) -> ObjectStore:
    store = open_store("memory://")
    for key, data in objects.items():
        store.put(key, data)
    return store


# --- the spec text ---------------------------------------------------------------------------------------------


def test_parse_and_round_trip() -> None:
    faults = StoreFaults.parse("latency_ms=20,bandwidth_mbps=400,throttle_rate=0.05")
    assert faults == StoreFaults(latency_ms=20, bandwidth_mbps=400, throttle_rate=0.05)
    assert faults.to_spec() == "latency_ms=20,bandwidth_mbps=400,throttle_rate=0.05"
    every = StoreFaults(latency_ms=1.5, bandwidth_mbps=0.1, max_concurrent=3, throttle_rate=1 / 3, fail_rate=0.25)
    assert StoreFaults.parse(every.to_spec()) == every
    assert StoreFaults.parse(" max_concurrent = 4 , ").max_concurrent == 4
    assert StoreFaults.parse("") == StoreFaults() and StoreFaults().to_spec() == "" and not StoreFaults().enabled
    assert StoreFaults.from_env({ENV_VAR: "fail_rate=1"}) == StoreFaults(fail_rate=1)
    assert StoreFaults.from_env({}) == StoreFaults()


@pytest.mark.parametrize(
    "text",
    [
        "latency=20",
        "latency_ms",
        "latency_ms=fast",
        "latency_ms=-1",
        "latency_ms=nan",
        "bandwidth_mbps=inf",
        "max_concurrent=1.5",
        "throttle_rate=0.7,fail_rate=0.7",
        "latency_ms=1,latency_ms=2",
    ],
)
def test_parse_rejects_bad_text(text: str) -> None:
    with pytest.raises(InvalidArgument):
        StoreFaults.parse(text)


def test_with_faults_wraps_only_when_asked() -> None:
    store = memory_store()
    assert with_faults(store, {}) is store
    wrapped = with_faults(store, {ENV_VAR: "latency_ms=1"})
    assert isinstance(wrapped, FaultyStore) and wrapped.url == store.url == "memory://"


# --- latency, throttling, failures -----------------------------------------------------------------------------


def test_latency_before_every_get_only() -> None:
    clock = FakeClock(0.0)
    inner = memory_store(k=b"0123456789")
    store = FaultyStore(inner, StoreFaults(latency_ms=20), sleep=clock.sleep, clock=clock)
    assert store.get_range("k", 2, 3) == b"234"
    assert store.get("k") == b"0123456789"
    store.put("j", b"x")
    assert store.head("k").size == 10 and store.exists("j") and store.list("") == ["j", "k"]
    store.delete("j")
    assert clock.sleeps == [0.02, 0.02]
    assert store.stats.snapshot() == {"gets": 2, "get_bytes": 13, "puts": 1, "errors": 0, "throttled": 0}


def test_download_is_faulted_too(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    store = FaultyStore(
        memory_store(k=b"x" * MB), StoreFaults(latency_ms=5, bandwidth_mbps=8), clock.sleep, clock=clock
    )
    store.download("k", tmp_path / "k")
    assert (tmp_path / "k").stat().st_size == MB
    assert clock.sleeps == pytest.approx([0.005, 1.0])


def test_throttle_and_fail_rates_use_one_draw_per_get() -> None:
    inner = memory_store(k=b"abc")
    clock = FakeClock(0.0)
    rng = ScriptedRng([0.05, 0.15, 0.25, 0.5])
    store = FaultyStore(inner, StoreFaults(throttle_rate=0.1, fail_rate=0.2), sleep=clock.sleep, rng=rng)
    with pytest.raises(StoreThrottled, match="SlowDown"):
        store.get_range("k", 0, 1)
    with pytest.raises(StoreError) as failed:
        store.get_range("k", 0, 1)
    assert type(failed.value) is StoreError
    with pytest.raises(StoreError):
        store.get("k")
    assert store.get_range("k", 0, 3) == b"abc"
    assert store.stats.snapshot() == {"gets": 4, "get_bytes": 3, "puts": 0, "errors": 3, "throttled": 1}
    assert inner.stats.gets == 1  # injected answers never reach the real store


def test_throttle_rate_over_many_gets() -> None:
    inner = memory_store(k=b"abc")
    store = FaultyStore(inner, StoreFaults(throttle_rate=0.05), sleep=lambda s: None, rng=random.Random(1234))
    throttled = 0
    for _ in range(2000):
        try:
            store.get_range("k", 0, 1)
        except StoreThrottled:
            throttled += 1
    assert 60 <= throttled <= 140 and store.stats.throttled == throttled
    assert inner.stats.gets == 2000 - throttled


def test_inner_errors_are_counted_and_passed_through() -> None:
    store = FaultyStore(memory_store(), StoreFaults(latency_ms=1), sleep=lambda s: None)
    with pytest.raises(StoreError):
        store.get_range("missing", 0, 1)
    assert store.stats.errors == 1


# --- bandwidth -------------------------------------------------------------------------------------------------


def test_bandwidth_single_get_takes_size_over_rate() -> None:
    clock = FakeClock(0.0)
    store = FaultyStore(memory_store(k=bytes(2 * MB)), StoreFaults(bandwidth_mbps=80), sleep=clock.sleep, clock=clock)
    store.get_range("k", 0, MB)  # 1 MB at 10 MB/s
    assert sum(clock.sleeps) == pytest.approx(0.1)
    store.get("k")  # 2 MB
    assert sum(clock.sleeps) == pytest.approx(0.3)


def test_virtual_clock_when_only_sleep_is_injected() -> None:
    slept: list[float] = []
    store = FaultyStore(memory_store(k=bytes(MB)), StoreFaults(bandwidth_mbps=8, latency_ms=10), sleep=slept.append)
    for _ in range(3):
        store.get("k")
    assert slept == pytest.approx([0.01, 1.0] * 3)  # never spins on a sleep that does not pass time


def test_shared_link_is_processor_sharing() -> None:
    link = SharedLink(rate=100.0)  # bytes/s
    a = link.start(100, now=0.0)
    b = link.start(100, now=0.0)
    assert link.eta(a) == pytest.approx(2.0) and link.active == 2  # both at half rate
    link.advance(1.0)
    assert not link.finished(a) and link.eta(b) == pytest.approx(1.0)
    c = link.start(25, now=1.0)  # 3 flows now: c needs 25 bytes at 33.3 B/s
    assert link.eta(c) == pytest.approx(0.75)
    assert link.eta(a) == pytest.approx(0.75 + 25 / 50)  # then a and b share again
    link.advance(1.75)
    assert link.finished(c) and not link.finished(a)
    link.advance(2.25)
    assert link.finished(a) and link.finished(b) and link.active == 0
    small = link.start(10, now=5.0)  # an idle link serves one flow at full rate
    assert link.eta(small) == pytest.approx(0.1)
    link.cancel(small)
    assert link.finished(small) and link.eta(small) == 0.0


def test_shared_link_unequal_flows() -> None:
    link = SharedLink(rate=10.0)
    big, little = link.start(30, now=0.0), link.start(10, now=0.0)
    assert link.eta(little) == pytest.approx(2.0)  # 10 bytes at 5 B/s
    assert link.eta(big) == pytest.approx(2.0 + 20 / 10)  # then alone at full rate
    link.advance(10.0)
    assert link.finished(big) and link.finished(little)
    with pytest.raises(ValueError):
        SharedLink(0)


def test_bandwidth_is_shared_by_concurrent_gets_real_threads() -> None:
    """4 GETs of 50 kB on a 4 Mbit/s (500 kB/s) link: alone 0.1 s each; together every one takes ~0.4 s."""
    store = FaultyStore(memory_store(k=bytes(50_000)), StoreFaults(bandwidth_mbps=4))
    durations: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def fetch() -> None:
        start.wait()
        t0 = time.monotonic()
        store.get_range("k", 0, 50_000)
        with lock:
            durations.append(time.monotonic() - t0)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(durations) == 4
    assert min(durations) >= 0.3, durations  # fair sharing: nobody gets the whole link (FIFO would give 0.1)
    assert max(durations) < 1.0, durations


# --- concurrency cap -------------------------------------------------------------------------------------------


class GatedStore:
    """Wraps a store; get_range blocks until released and records the peak number of callers inside."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.inside = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        self.gate.wait(timeout=5)
        with self.lock:
            self.inside -= 1
        return self.inner.get_range(key, start, length)


def test_max_concurrent_queues_the_excess() -> None:
    gated = GatedStore(memory_store(k=b"abcdef"))
    store = FaultyStore(gated, StoreFaults(max_concurrent=2))  # type: ignore[arg-type]  # duck-typed inner
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(store.get_range("k", 0, 6))) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while gated.inside < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)  # give queued GETs the chance to (wrongly) get in
    assert gated.inside == 2
    gated.gate.set()
    for t in threads:
        t.join()
    assert results == [b"abcdef"] * 6 and gated.peak == 2
