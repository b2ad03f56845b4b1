"""ObjectStore against a real S3 API: a moto server on 127.0.0.1, sometimes behind a throttling proxy."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.errors import InvalidArgument, ObjectNotFound, StoreError, StoreThrottled
from cryobox.objstore.client import OTHER_RETRIES, PART_SIZE, ObjectStore, open_store
from cryobox.objstore.faults import FaultyStore, StoreFaults
from cryobox.objstore.gc import GcPolicy, collect
from tests.support.s3 import CREDENTIALS, MotoServer, ThrottlePolicy, ThrottlingProxy, moto_server, throttling_proxy
from tests.support.storegc import hours_later, live_problems, put_generation, put_image, put_orphan, referenced

MiB = 1 << 20


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_server() as server:
        yield server


@pytest.fixture
def bucket(moto: MotoServer) -> str:
    return moto.create_bucket()


@pytest.fixture
def store(moto: MotoServer, bucket: str) -> ObjectStore:
    return moto.open(bucket)


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[ThrottlingProxy]:
    with throttling_proxy(moto.endpoint) as p:
        yield p


@pytest.fixture
def proxied(moto: MotoServer, bucket: str, proxy: ThrottlingProxy) -> ObjectStore:
    return moto.open(bucket, proxy.endpoint)


def test_put_get_head_list_delete(store: ObjectStore, moto: MotoServer, bucket: str) -> None:
    assert store.url == f"s3://{bucket}?endpoint={moto.endpoint}"
    store.put("gen1/memory.idx", b"index bytes")
    store.put("gen1/sub/x", b"x")
    store.put("gen10/y", b"y")
    assert store.get("gen1/memory.idx") == b"index bytes"
    meta = store.head("gen1/memory.idx")
    assert meta.size == 11 and meta.etag and meta.etag.strip('"')
    assert store.exists("gen1/memory.idx") and not store.exists("gen1/nope")
    assert store.list("") == ["gen1/memory.idx", "gen1/sub/x", "gen10/y"]
    assert store.list("gen1") == ["gen1/memory.idx", "gen1/sub/x"]  # whole segments: not gen10/
    store.delete("gen1/sub/x")
    store.delete("gen1/sub/x")  # missing: not an error
    assert store.list("gen1") == ["gen1/memory.idx"]
    assert store.stats.puts == 3 and store.stats.gets == 1 and store.stats.errors == 0


def test_missing_keys_and_buckets(store: ObjectStore, moto: MotoServer, tmp_path: Path) -> None:
    for call in (
        lambda: store.get("absent"),
        lambda: store.get_range("absent", 0, 8),
        lambda: store.head("absent"),
        lambda: store.download("absent", tmp_path / "absent"),
        lambda: moto.open("no-such-bucket").get_range("k", 0, 1),
    ):
        with pytest.raises(ObjectNotFound) as caught:
            call()
        assert isinstance(caught.value.__cause__, FileNotFoundError)
    assert list(tmp_path.iterdir()) == []
    assert store.stats.errors == 4


def test_range_semantics(store: ObjectStore) -> None:
    data = os.urandom(100_000)
    store.put("pack", data)
    assert store.get_range("pack", 0, 1) == data[:1]
    assert store.get_range("pack", 4096, 8192) == data[4096 : 4096 + 8192]
    assert store.get_range("pack", len(data) - 10, 10) == data[-10:]
    with pytest.raises(StoreError, match="short read"):  # S3 answers the remainder; we insist on the length
        store.get_range("pack", len(data) - 10, 20)
    with pytest.raises(StoreError) as beyond:  # 416 InvalidRange
        store.get_range("pack", len(data), 1)
    assert type(beyond.value) is StoreError and beyond.value.details["status"] == 416
    with pytest.raises(InvalidArgument):
        store.get_range("pack", 0, -1)


def test_put_file_multipart_download_and_ranges(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "memory.pack"
    data = os.urandom(2 * PART_SIZE + 4 * MiB)  # 20 MiB: three parts
    src.write_bytes(data)
    store.put_file("gen1/memory.pack", src)
    meta = store.head("gen1/memory.pack")
    assert meta.size == len(data)
    assert meta.etag is not None and meta.etag.strip('"').endswith("-3")  # S3's multipart ETag: md5-of-md5s-<parts>
    for start in (0, PART_SIZE - 100, 2 * PART_SIZE - 1, len(data) - 4 * MiB):
        assert store.get_range("gen1/memory.pack", start, 4 * MiB) == data[start : start + 4 * MiB]
    dest = tmp_path / "copy"
    store.download("gen1/memory.pack", dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "memory.pack"]


def test_range_gets_are_not_retried_and_throttling_is_store_throttled(
    proxied: ObjectStore, proxy: ThrottlingProxy, store: ObjectStore
) -> None:
    store.put("pack", b"0123456789")
    proxy.set_policy(ThrottlePolicy(first=2))
    for _ in range(2):
        with pytest.raises(StoreThrottled) as caught:
            proxied.get_range("pack", 2, 4)
        assert caught.value.details["status"] == 503 and "SlowDown" in str(caught.value.__cause__)
    assert proxied.get_range("pack", 2, 4) == b"2345"
    assert proxy.count("GET") == 3  # one GET per call: the resolver owns retries
    assert proxied.stats.snapshot() == {"gets": 3, "get_bytes": 4, "puts": 0, "errors": 2, "throttled": 2}


def test_every_kth_get_throttled_and_429(proxied: ObjectStore, proxy: ThrottlingProxy, store: ObjectStore) -> None:
    store.put("pack", b"abcdef")
    proxy.set_policy(ThrottlePolicy(every=3))
    outcomes = []
    for _ in range(6):
        try:
            proxied.get_range("pack", 0, 2)
            outcomes.append("ok")
        except StoreThrottled:
            outcomes.append("throttled")
    assert outcomes == ["ok", "ok", "throttled"] * 2
    proxy.set_policy(ThrottlePolicy(every=1, status=429))
    with pytest.raises(StoreThrottled) as caught:
        proxied.get_range("pack", 0, 2)
    assert caught.value.details["status"] == 429
    proxy.set_policy(ThrottlePolicy(every=1, status=500))
    with pytest.raises(StoreError) as failed:
        proxied.get_range("pack", 0, 2)
    assert type(failed.value) is StoreError and failed.value.details["status"] == 500


def test_whole_object_gets_keep_a_small_retry_budget(
    proxied: ObjectStore, proxy: ThrottlingProxy, store: ObjectStore
) -> None:
    store.put("idx", b"index")
    proxy.set_policy(ThrottlePolicy(first=1))
    assert proxied.get("idx") == b"index"  # obstore retried the 503 once
    assert proxy.count("GET") == 2
    proxy.set_policy(ThrottlePolicy(every=1))
    with pytest.raises(StoreThrottled):
        proxied.get("idx")
    assert proxy.count("GET") == 2 + 1 + OTHER_RETRIES


def test_concurrent_range_gets_run_in_parallel(
    proxied: ObjectStore, proxy: ThrottlingProxy, store: ObjectStore
) -> None:
    store.put("pack", bytes(range(256)))
    proxy.set_policy(ThrottlePolicy(delay_s=0.25))
    results: dict[int, bytes] = {}

    def fetch(i: int) -> None:
        results[i] = proxied.get_range("pack", i, 8)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    assert results == {i: bytes(range(i, i + 8)) for i in range(8)}
    assert elapsed < 1.0, elapsed  # serialised they would take 2 s: the GIL is released during I/O


def test_faulty_store_over_s3(store: ObjectStore, proxy: ThrottlingProxy, moto: MotoServer, bucket: str) -> None:
    store.put("pack", b"0123456789")
    inner = moto.open(bucket, proxy.endpoint)
    faulty = FaultyStore(inner, StoreFaults(throttle_rate=1))
    with pytest.raises(StoreThrottled):
        faulty.get_range("pack", 0, 4)
    assert proxy.count("GET") == 0 and faulty.stats.throttled == 1  # injected before the store is asked
    slow = FaultyStore(inner, StoreFaults(latency_ms=50))
    t0 = time.monotonic()
    assert slow.get_range("pack", 0, 4) == b"0123"
    assert time.monotonic() - t0 >= 0.05 and proxy.count("GET") == 1


def test_unreachable_endpoint_fails_fast() -> None:
    store = open_store("s3://bkt?endpoint=http://127.0.0.1:9&region=us-east-1", env=CREDENTIALS)
    t0 = time.monotonic()
    with pytest.raises(StoreError) as caught:
        store.get_range("k", 0, 1)
    assert type(caught.value) is StoreError and time.monotonic() - t0 < 2


def test_a_store_gc_over_s3_keeps_live_images_and_removes_the_rest(store: ObjectStore, tmp_path: Path) -> None:
    """Sizes and last-modified times come from S3's listing; a GC run over it keeps exactly what live images name."""
    put_generation(store, tmp_path, "g1", {0: b"kernel", 1: b"gen 1"}, time.time() - 7200, latest=True)
    orphan = put_orphan(store, b"orphan")
    put_image(store, tmp_path, "snapshots/dead", {0: b"dead"}, None)
    assert all(m.last_modified is not None and abs(m.last_modified - time.time()) < 600 for m in store.list_meta(""))
    report = collect(store, GcPolicy(grace_s=3600), hours_later(2))
    assert report.complete and live_problems(store) == [] and not store.exists(orphan)
    assert sorted(store.list("chunks")) == sorted(referenced(store)) and store.list("snapshots") == []
    assert store.list("leases") == [] and store.list("gc") == []
