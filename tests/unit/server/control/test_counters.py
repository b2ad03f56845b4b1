"""The agents' counters gathered by the control plane: every live agent asked at once, a slow or failing one shown as
such (its last counters kept) without holding up the others, one gather per ``max_age_s`` on an injected clock
however many readers, the sums and the per-agent series of the exposition, the roster from the real fleet, an agent
reached through the real HTTP transport, and ``cryobox serve``'s scrape counting its one memory server once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cryobox.agent.memory.server.metrics import MemoryMetrics
from cryobox.agentapi import Agent, HttpAgent, create_agent_app
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.agentapi.models_obs import AgentCounters
from cryobox.cli.top_model import parse_counters
from cryobox.console.sampler import parse_sample
from cryobox.errors import HostUnavailable
from cryobox.registry import Registry
from cryobox.server.control.counters import CounterGatherer, FleetCounters, exposition
from tests.support import registry as registry_support
from tests.support.clock import FakeClock
from tests.support.control import control_plane
from tests.support.fake_agent import FakeAgent

registry = registry_support.sqlite_registry
__all__ = ["registry"]


class SlowAgent(FakeAgent):
    """Answers ``counters`` only once ``release`` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.release = asyncio.Event()

    async def counters(self) -> AgentCounters:
        self._record("counters")
        await self.release.wait()
        return self.herd


class WaitsForPeer(FakeAgent):
    """Answers ``counters`` only after ``peer`` was asked: a gather that asked one agent after the other would
    time out on this one."""

    def __init__(self, name: str, peer: FakeAgent) -> None:
        super().__init__(name=name)
        self.peer = peer

    async def counters(self) -> AgentCounters:
        self._record("counters")
        while "counters" not in self.peer.call_names():
            await asyncio.sleep(0)
        return self.herd


def herd(faults: int, fetches: int = 0, hits: int = 0, gets: int = 0, cache: int = 0) -> AgentCounters:
    return AgentCounters(
        faults=faults, chunk_fetches=fetches, cache_hits=hits, store_gets=gets, chunk_cache_bytes=cache
    )


def roster_of(*agents: FakeAgent) -> Sequence[tuple[str, Agent]]:
    return [(a.name, a) for a in agents]


def gatherer(*agents: FakeAgent, clock: FakeClock | None = None, timeout_s: float = 1.0) -> CounterGatherer:
    async def roster() -> Sequence[tuple[str, Agent]]:
        return roster_of(*agents)

    return CounterGatherer(roster, timeout_s=timeout_s, clock=clock or FakeClock())


def samples(text: str) -> dict[tuple[str, str], float]:
    """``(sample name, agent label) -> value`` of a text exposition."""
    return {
        (s.name, s.labels.get("agent", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_slow_and_a_failing_agent_never_hold_up_the_others() -> None:
    fine, slow, failing = FakeAgent(name="a"), SlowAgent("b"), FakeAgent(name="c")
    fine.herd, failing.herd = herd(10, 2, 7, 3), herd(100)
    failing.fail_next["counters"] = HostUnavailable("memory server down")
    got = await gatherer(fine, slow, failing, timeout_s=0.05).read()
    assert [(r.agent, r.status, r.error) for r in got.agents] == [
        ("a", "ok", ""),
        ("b", "timeout", "timeout"),
        ("c", "error", "capacity"),
    ]
    assert got.agents[0].counters == fine.herd and got.agents[1].counters is None
    assert got.totals()["faults"] == 10  # nobody answered for b or c yet


async def test_agents_are_asked_at_once() -> None:
    second = FakeAgent(name="b")
    first = WaitsForPeer("a", second)  # asked first (by name); answers only once b was asked too
    first.herd, second.herd = herd(1), herd(2)
    got = await gatherer(first, second, timeout_s=0.5).read()
    assert [r.status for r in got.agents] == ["ok", "ok"] and got.totals()["faults"] == 3


async def test_an_agent_that_stops_answering_keeps_its_last_counters() -> None:
    clock = FakeClock()
    a, b = FakeAgent(name="a"), FakeAgent(name="b")
    a.herd, b.herd = herd(10, cache=4096), herd(5)
    counters = gatherer(a, b, clock=clock)
    assert (await counters.read()).totals()["faults"] == 15
    a.fail_next["counters"] = RuntimeError("connection reset")
    b.herd = herd(8)
    clock.advance(2.0)
    got = await counters.read()
    assert [(r.status, r.error) for r in got.agents] == [("error", "unreachable"), ("ok", "")]
    assert got.agents[0].counters == herd(10, cache=4096)  # kept: no dip to 0 and back
    assert got.totals()["faults"] == 18 and got.totals()["chunk_cache_bytes"] == 4096


async def test_one_gather_per_max_age_however_many_readers() -> None:
    clock = FakeClock()
    a, b = FakeAgent(name="a"), FakeAgent(name="b")
    counters = gatherer(a, b, clock=clock)
    first = await asyncio.gather(*(counters.read() for _ in range(10)))  # ten streams at once
    assert all(got is first[0] for got in first)
    clock.advance(1.9)
    a.herd = herd(99)
    assert (await counters.read()).totals()["faults"] == 0  # still the cached gather
    assert (a.call_names().count("counters"), b.call_names().count("counters")) == (1, 1)
    clock.advance(0.1)
    assert (await counters.read()).totals()["faults"] == 99
    assert (a.call_names().count("counters"), b.call_names().count("counters")) == (2, 2)
    clock.advance(-5.0)  # a clock that went back never serves a gather from the future
    await counters.read()
    assert a.call_names().count("counters") == 3


async def test_the_exposition_per_agent_and_summed() -> None:
    a, b, slow = FakeAgent(name="a"), FakeAgent(name="b"), SlowAgent("z")
    a.herd, b.herd = herd(10, 2, 7, 3, cache=100), herd(5, 1, 1, 2, cache=50)
    text = await gatherer(a, b, slow, timeout_s=0.05).exposition()
    got = samples(text)
    assert got[("cryobox_agent_faults_total", "a")] == 10 and got[("cryobox_agent_faults_total", "b")] == 5
    assert got[("cryobox_fleet_faults_total", "")] == 15 and got[("cryobox_fleet_store_gets_total", "")] == 5
    assert got[("cryobox_agent_chunk_cache_bytes", "a")] == 100 and got[("cryobox_fleet_chunk_cache_bytes", "")] == 150
    assert got[("cryobox_agent_counters_up", "a")] == 1 and got[("cryobox_agent_counters_up", "z")] == 0
    assert ("cryobox_agent_faults_total", "z") not in got  # no counters yet: no series
    assert samples(exposition(FleetCounters(0.0, ())))[("cryobox_fleet_faults_total", "")] == 0


async def test_the_control_plane_asks_its_live_agents(registry: Registry) -> None:
    clock = FakeClock()
    a, b = FakeAgent(name="a", clock=clock), FakeAgent(name="b", clock=clock)
    a.herd, b.herd = herd(10), herd(5)
    control = control_plane(registry, {"a": a, "b": b}, clock=clock)
    await control.fleet.heartbeat(await heartbeat_of(a))
    await control.fleet.heartbeat(await heartbeat_of(b))
    clock.advance(8.0)
    await control.fleet.heartbeat(await heartbeat_of(a))
    clock.advance(5.0)  # b is silent past the deadline: not live, not asked
    got = await control.counters.read()
    assert [r.agent for r in got.agents] == ["a"] and "counters" not in b.call_names()
    body, _ = await control.metrics.render_all()  # what GET /metrics serves
    assert samples(body.decode())[("cryobox_fleet_faults_total", "")] == 10


async def test_an_agent_over_the_http_transport() -> None:
    fake = FakeAgent(name="remote")
    fake.herd = herd(42, 4, 30, 5)
    transport = httpx.ASGITransport(app=create_agent_app(fake, "node-token"))
    async with HttpAgent("http://agent", "node-token", transport=transport, name="remote") as agent:

        async def roster() -> Sequence[tuple[str, Agent]]:
            return [("remote", agent)]

        got = await CounterGatherer(roster, clock=FakeClock()).read()
    assert got.agents[0].status == "ok" and got.agents[0].counters == fake.herd


class ServedAgent(FakeAgent):
    """``cryobox serve``'s in-process agent: its memory server's real series in its scrape, the same figures typed."""

    def __init__(self, name: str, faults: int, fetches: int) -> None:
        super().__init__(name=name)
        self.memory = MemoryMetrics()
        self.memory.faults.inc(faults)
        self.memory.chunk_fetches.inc(fetches)
        self.herd = herd(faults, fetches)

    async def metrics_text(self) -> bytes:
        return self.memory.render()[0]


async def test_serve_counts_its_one_memory_server_once(registry: Registry) -> None:
    local = ServedAgent("host", 120, 30)
    control = control_plane(registry, {"host": local})

    async def local_series() -> str:  # as cli/serve.py appends the in-process agent's scrape
        return (await local.metrics_text()).decode()

    control.metrics.add_source(local_series)
    await control.fleet.heartbeat(await heartbeat_of(local))
    text = (await control.metrics.render_all())[0].decode()
    assert samples(text)[("faults_total", "")] == 120  # the memory server's own series stay in the scrape
    assert parse_sample(text, 0.0)["herd"]["faults"] == 120
    assert parse_counters(text)["faults"] == 120 and parse_counters(text)["chunk_fetches"] == 30
