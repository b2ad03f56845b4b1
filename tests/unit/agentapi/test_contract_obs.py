"""Samples and logs cross both agent transports alike (``pair``: in-process and HTTP on a real server): query
values, the log query's body, its validation (400 over HTTP, before the agent), and 404; the host's counters."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from cryobox.agentapi import models as m
from cryobox.agentapi.models_obs import AgentCounters, LogQuery, MetricSample
from cryobox.errors import HostUnavailable, NotFound
from tests.support.fake_agent import FakeAgent
from tests.unit.agentapi.test_contract import TOKEN, Pair, http_fake, pair

__all__ = ["http_fake", "pair"]  # fixtures


def sample(t: float) -> MetricSample:
    return MetricSample(timestamp=t, cpu_count=1, cpu_pct=12.5, memory_bytes=1, mem_total=2, mem_used=1)


async def test_metrics_and_logs(pair: Pair) -> None:
    await pair.agent.create(m.CreateSpec(sandbox_id="sb-1", template="base", workspace_id="ws"))
    pair.fake.samples["sb-1"] = [sample(10.0), sample(20.5), sample(30.0)]
    for i in range(5):
        pair.fake.logbook.add("sb-1", 100.0 + i, "warn" if i == 2 else "info", "console", f"line {i}")
    series = await pair.agent.sandbox_metrics("sb-1", start=15.0, end=30.0)
    assert [s.timestamp for s in series.samples] == [20.5, 30.0] and series.samples[0].cpu_pct == 12.5
    assert pair.fake.calls[-1] == ("sandbox_metrics", ("sb-1", 15.0, 30.0))
    page = await pair.agent.sandbox_logs("sb-1", LogQuery(limit=2, offset=1))
    assert [e.message for e in page.entries] == ["line 1", "line 2"] and page.next_offset == 3
    backward = await pair.agent.sandbox_logs("sb-1", LogQuery(direction="backward", level="warn"))
    assert [e.offset for e in backward.entries] == [2]
    with pytest.raises(NotFound):
        await pair.agent.sandbox_metrics("sb-none")
    with pytest.raises(NotFound):
        await pair.agent.sandbox_logs("sb-none", LogQuery())


async def test_bad_queries_never_reach_the_agent(http_fake: tuple[str, FakeAgent]) -> None:
    url, fake = http_fake
    with pytest.raises(ValidationError):
        LogQuery(limit=5000)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        bad = await client.post("/agent/v1/sandboxes/sb-1/logs", json={"limit": 5000})
        worse = await client.get("/agent/v1/sandboxes/sb-1/metrics", params={"start": "yesterday"})
    assert (bad.status_code, worse.status_code) == (400, 400)
    assert not [c for c in fake.calls if c[0] in ("sandbox_logs", "sandbox_metrics")]


async def test_counters(pair: Pair) -> None:
    pair.fake.herd = AgentCounters(faults=120, chunk_fetches=30, cache_hits=90, store_gets=33, chunk_cache_bytes=7)
    got = await pair.agent.counters()
    assert got == pair.fake.herd and pair.fake.calls[-1] == ("counters", ())
    pair.fake.fail_next["counters"] = HostUnavailable("memory server down")
    with pytest.raises(HostUnavailable):
        await pair.agent.counters()
