"""The agents' counters, gathered by the control plane: every live agent is asked (:meth:`Agent.counters
<cryobox.agentapi.Agent.counters>`) at once, each for at most ``timeout_s``, and the answers are kept for
``max_age_s``, so however many scrapes, console streams and ``cryobox top`` windows read them, each agent is asked
at most once per ``max_age_s`` (one gather at a time: a reader arriving during a gather waits for it).

An agent that does not answer in time, or answers with an error, never holds up the others and never fails the
gather: its reading says so (``timeout`` / ``error`` and the error's code) and keeps the counters it last gave, so
a silent agent does not look like a restart (its counters dropping to 0 and coming back). Only the agents live now
are asked and remembered: one that went down or left the registry leaves the readings.

:func:`exposition` renders a gather as Prometheus text (appended to the control plane's ``/metrics``): per agent
``cryobox_agent_<counter>_total{agent}``, ``cryobox_agent_chunk_cache_bytes{agent}`` and
``cryobox_agent_counters_up{agent}`` (1: it answered this gather), and the fleet's sums
``cryobox_fleet_<counter>_total`` and ``cryobox_fleet_chunk_cache_bytes``. Each agent's memory server is counted
once there: the in-process agent of ``cryobox serve`` is one of the agents asked, and its memory server's own
series appended to the same scrape (``faults_total``, ...) keep their names, which nothing here sums.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ...agentapi import Agent
from ...agentapi.models_obs import COUNTER_FIELDS, AgentCounters
from ...errors import CryoboxError
from .fleet import Fleet

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final = 1.0
DEFAULT_MAX_AGE_S: Final = 2.0
GAUGE_FIELD: Final = "chunk_cache_bytes"
Status = Literal["ok", "timeout", "error"]
Roster = Callable[[], Awaitable[Sequence[tuple[str, Agent]]]]
"""The agents to ask now, by name."""


@dataclass(frozen=True)
class AgentReading:
    agent: str
    status: Status
    counters: AgentCounters | None
    """This gather's answer; after a timeout or an error the last answer the agent gave (``None``: none yet)."""
    error: str = ""
    """The error's code (``timeout``, ``capacity``...) when the agent did not answer."""


@dataclass(frozen=True)
class FleetCounters:
    at: float
    """When the gather ended (the gatherer's clock)."""
    agents: tuple[AgentReading, ...]
    """By agent name."""

    def totals(self) -> dict[str, int]:
        """Every field of :class:`AgentCounters` summed over the readings that hold counters."""
        sums = dict.fromkeys(AgentCounters.model_fields, 0)
        for reading in self.agents:
            if reading.counters is not None:
                for key, value in reading.counters.model_dump().items():
                    sums[key] += int(value)
        return sums


def fleet_roster(fleet: Fleet) -> Roster:
    """The fleet's live agents (registered, up or draining, heartbeating), in-process ones included."""

    async def roster() -> list[tuple[str, Agent]]:
        return [(row.name, agent) for row, agent in await fleet.live_agents()]

    return roster


class CounterGatherer:
    def __init__(
        self,
        roster: Roster,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._roster = roster
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._cached: FleetCounters | None = None
        self._last: dict[str, AgentCounters] = {}
        """Each live agent's last answer."""

    async def read(self) -> FleetCounters:
        """The counters of every live agent, at most ``max_age_s`` old (gathered now when older)."""
        async with self._lock:
            cached = self._cached
            if cached is not None and 0 <= self._clock() - cached.at < self.max_age_s:
                return cached
            self._cached = await self._gather()
            return self._cached

    async def exposition(self) -> str:
        """:meth:`read` as Prometheus text (:func:`exposition`)."""
        return exposition(await self.read())

    async def _gather(self) -> FleetCounters:
        roster = sorted(await self._roster(), key=lambda pair: pair[0])
        readings = await asyncio.gather(*(self._ask(name, agent) for name, agent in roster))
        self._last = {r.agent: r.counters for r in readings if r.counters is not None}
        return FleetCounters(self._clock(), tuple(readings))

    async def _ask(self, name: str, agent: Agent) -> AgentReading:
        try:
            counters = await asyncio.wait_for(agent.counters(), self.timeout_s)
        except TimeoutError:
            return AgentReading(name, "timeout", self._last.get(name), "timeout")
        except CryoboxError as err:
            return AgentReading(name, "error", self._last.get(name), err.code)
        except Exception as err:  # a transport failure, an agent too old to know the operation
            log.warning("agent %s: counters failed: %s", name, err)
            return AgentReading(name, "error", self._last.get(name), "unreachable")
        return AgentReading(name, "ok", counters)


HELP: Final = {
    "faults": "Reads of memory images served (page faults reaching the resolver)",
    "chunk_fetches": "Chunks fetched from the object store and verified",
    "zero_fills": "Zero chunks served as zeros without a fetch",
    "cache_hits": "Chunks served from the local chunk cache",
    "prefetch_hits": "Reads served by a chunk that prefetch brought in",
    "prefetch_chunks": "Chunks fetched from the store by prefetch",
    "store_gets": "GET attempts against the object store, retries included",
    "chunk_fetch_failures": "Chunk fetches that failed after their retries or deadline",
    GAUGE_FIELD: "Bytes allocated by the chunk cache",
}


class _Families(Collector):
    def __init__(self, gathered: FleetCounters) -> None:
        self.gathered = gathered

    def collect(self) -> Iterable[Metric]:
        readings = self.gathered.agents
        totals = self.gathered.totals()
        for key in COUNTER_FIELDS:
            per_agent = CounterMetricFamily(f"cryobox_agent_{key}", f"{HELP[key]}, per agent", labels=["agent"])
            for reading in readings:
                if reading.counters is not None:
                    per_agent.add_metric([reading.agent], getattr(reading.counters, key))
            yield per_agent
            yield CounterMetricFamily(f"cryobox_fleet_{key}", f"{HELP[key]}, every live agent's", totals[key])
        cache = GaugeMetricFamily(f"cryobox_agent_{GAUGE_FIELD}", f"{HELP[GAUGE_FIELD]}, per agent", labels=["agent"])
        for reading in readings:
            if reading.counters is not None:
                cache.add_metric([reading.agent], reading.counters.chunk_cache_bytes)
        yield cache
        yield GaugeMetricFamily(
            f"cryobox_fleet_{GAUGE_FIELD}", f"{HELP[GAUGE_FIELD]}, every live agent's", totals[GAUGE_FIELD]
        )
        up = GaugeMetricFamily(
            "cryobox_agent_counters_up", "1: the agent answered the last gather of its counters", labels=["agent"]
        )
        for reading in readings:
            up.add_metric([reading.agent], 1.0 if reading.status == "ok" else 0.0)
        yield up


def exposition(gathered: FleetCounters) -> str:
    """``gathered`` as Prometheus text: per agent (label ``agent``) and summed over the fleet."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(gathered))
    return generate_latest(registry).decode()
