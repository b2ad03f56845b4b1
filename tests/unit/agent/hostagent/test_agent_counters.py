"""The host agent's ``counters``: the memory server's real exposition (its collectors rendered by
prometheus_client) answered as typed figures, and ``HostUnavailable`` when the memory server does not answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryobox.agent.hostagent.counters import counters_from_text
from cryobox.agent.memory.server.metrics import MemoryMetrics
from cryobox.agentapi import InProcessAgent
from cryobox.agentapi.models_obs import COUNTER_FIELDS, AgentCounters
from cryobox.errors import HostUnavailable
from tests.support.fake_host import FakeMemoryServer, make_agent


def exposition() -> str:
    metrics = MemoryMetrics()
    metrics.faults.inc(120)
    metrics.chunk_fetches.inc(30)
    metrics.zero_fills.inc(5)
    metrics.cache_hits.inc(90)
    metrics.prefetch_hits.inc(4)
    metrics.prefetch_chunks.inc(3)
    metrics.store_gets.inc(33)
    metrics.chunk_fetch_failures.inc(2)
    metrics.chunk_cache_bytes.set(4096)
    metrics.chunk_fetch_seconds.observe(0.01)  # a histogram beside them is no counter
    return metrics.render()[0].decode()


def test_every_field_is_read_from_the_memory_servers_exposition() -> None:
    got = counters_from_text(exposition())
    assert got == AgentCounters(
        faults=120,
        chunk_fetches=30,
        zero_fills=5,
        cache_hits=90,
        prefetch_hits=4,
        prefetch_chunks=3,
        store_gets=33,
        chunk_fetch_failures=2,
        chunk_cache_bytes=4096,
    )
    assert set(COUNTER_FIELDS) | {"chunk_cache_bytes"} == set(AgentCounters.model_fields)
    assert counters_from_text("") == AgentCounters()


async def test_the_agent_answers_its_memory_servers_counters(tmp_path: Path) -> None:
    rigged = make_agent(tmp_path)
    rigged.host.memserver = FakeMemoryServer(exposition())  # type: ignore[assignment]
    got = await InProcessAgent(rigged.agent).counters()
    assert got.faults == 120 and got.store_gets == 33 and got.chunk_cache_bytes == 4096


class SilentMemoryServer:
    async def metrics_text(self) -> str:
        raise ConnectionRefusedError("no memory server")


async def test_a_silent_memory_server_is_host_unavailable(tmp_path: Path) -> None:
    rigged = make_agent(tmp_path)
    rigged.host.memserver = SilentMemoryServer()  # type: ignore[assignment]
    with pytest.raises(HostUnavailable, match="memory server"):
        await InProcessAgent(rigged.agent).counters()
