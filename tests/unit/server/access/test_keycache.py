"""The API-key cache: a hit costs no lookup, an entry lives ``ttl_s`` (revocation takes effect within it)."""

from __future__ import annotations

import asyncio
import threading

from cryobox.registry import WorkspaceInfo
from cryobox.server.access.keycache import MAX_ENTRIES, KeyCache

WS = WorkspaceInfo(id="ws-1", name="default", created_at=0.0)


class Lookups:
    def __init__(self) -> None:
        self.keys: dict[str, WorkspaceInfo] = {"good": WS}
        self.calls: list[str] = []

    def __call__(self, key: str) -> WorkspaceInfo | None:
        self.calls.append(key)
        return self.keys.get(key)


def test_hits_cost_no_lookup_and_revocation_takes_effect_after_ttl() -> None:
    now = [100.0]
    lookups = Lookups()
    cache = KeyCache(lookups, ttl_s=5.0, clock=lambda: now[0])
    assert cache.authenticate("good") == WS
    assert cache.authenticate("good") == WS
    assert lookups.calls == ["good"]
    del lookups.keys["good"]  # revoked in the registry
    now[0] += 4.9
    assert cache.authenticate("good") == WS  # still within the TTL
    now[0] += 0.2
    assert cache.authenticate("good") is None
    assert lookups.calls == ["good", "good"]


def test_unknown_keys_are_cached_too_and_the_cache_is_bounded() -> None:
    lookups = Lookups()
    cache = KeyCache(lookups, ttl_s=60.0, clock=lambda: 0.0)
    assert cache.authenticate("nope") is None and cache.authenticate("nope") is None
    assert lookups.calls == ["nope"]
    for i in range(MAX_ENTRIES + 10):
        cache.authenticate(f"k{i}")
    assert len(cache._entries) == MAX_ENTRIES  # noqa: SLF001 (the bound is the point)
    lookups.calls.clear()
    cache.authenticate("nope")  # evicted first (least recently used)
    assert lookups.calls == ["nope"]


async def test_check_answers_a_hit_on_the_loop_and_looks_up_a_miss_on_a_thread() -> None:
    lookups = Lookups()
    threads: list[str] = []

    def lookup(key: str) -> WorkspaceInfo | None:
        threads.append(threading.current_thread().name)
        return lookups(key)

    cache = KeyCache(lookup, ttl_s=5.0, clock=lambda: 0.0)
    assert cache.cached("good") == (False, None)
    assert await cache.check("good") == WS
    assert threads and threads[0] != threading.current_thread().name  # the miss: on a worker thread
    assert cache.cached("good") == (True, WS)
    assert await cache.check("good") == WS
    assert await cache.check("nope") is None and await cache.check("nope") is None
    assert lookups.calls == ["good", "nope"]  # hits cost no lookup


async def test_requests_missing_on_one_key_at_once_share_one_lookup() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow(key: str) -> WorkspaceInfo | None:
        calls.append(key)
        started.set()
        release.wait(5)
        return WS if key == "good" else None

    cache = KeyCache(slow, ttl_s=5.0, clock=lambda: 0.0)
    first = asyncio.ensure_future(cache.check("good"))
    await asyncio.to_thread(started.wait, 5)
    others = [asyncio.ensure_future(cache.check("good")) for _ in range(3)]
    await asyncio.sleep(0.01)
    first.cancel()  # a caller that gives up does not take the others' lookup with it
    release.set()
    assert await asyncio.gather(*others) == [WS, WS, WS]
    assert calls == ["good"]
    assert cache._lookups == {}  # noqa: SLF001 (nothing kept once answered)
