"""Wire models of what an agent observes: a sandbox's CPU and memory samples and its log, and the host's own
counters (:class:`AgentCounters`).

Kept apart from :mod:`.models` (one concept per file). Times are epoch seconds on the agent's clock, sizes bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LogLevel = Literal["debug", "info", "warn", "error"]
LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warn", "error")
"""Least to most severe: a query's ``level`` keeps that level and the ones after it."""
LogSource = Literal["console", "agent"]
MAX_LOG_PAGE = 1000
MAX_LOG_SEARCH = 256


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MetricSample(_Model):
    """One sample of a running sandbox. ``cpu_pct`` and ``memory_bytes`` are measured on the host (the VM's
    cgroup, else its QEMU process: a guest cannot fake them); ``mem_*`` and ``disk_*`` are the guest's own view,
    read from its ``/proc`` without starting a process there (``guest_view`` false: the guest did not answer, and
    ``mem_total``/``mem_used`` are then the VM's RAM and the host's figure)."""

    timestamp: float
    cpu_count: int
    cpu_pct: float
    """The VM's CPU time over the interval before the sample, per vCPU, 0-100."""
    memory_bytes: int
    """What the host charges the VM for (its cgroup's memory, else QEMU's resident set)."""
    mem_total: int
    mem_used: int
    mem_cache: int = 0
    disk_total: int = 0
    disk_used: int = 0
    guest_view: bool = True


class MetricSeries(_Model):
    """A sandbox's samples in a time range, oldest first; ``dropped`` counts older ones no longer kept."""

    sandbox_id: str
    interval_s: float
    samples: list[MetricSample]
    dropped: int = 0


class LogQuery(_Model):
    """Which of a sandbox's log entries, and in which order.

    ``forward`` (oldest first): entries at ``offset`` or after, from ``start_ms`` on; ``backward`` (newest first):
    entries before ``offset``, up to ``end_ms``. ``level`` keeps that level and the more severe ones; ``search`` is
    a case-sensitive substring of the message."""

    limit: int = Field(default=100, ge=0, le=MAX_LOG_PAGE)
    direction: Literal["forward", "backward"] = "forward"
    offset: int | None = Field(default=None, ge=0)
    start_ms: int | None = Field(default=None, ge=0)
    end_ms: int | None = Field(default=None, ge=0)
    level: LogLevel | None = None
    search: str | None = Field(default=None, max_length=MAX_LOG_SEARCH)

    @model_validator(mode="after")
    def _range(self) -> LogQuery:
        if self.start_ms is not None and self.end_ms is not None and self.start_ms > self.end_ms:
            raise ValueError("start_ms is after end_ms")
        return self


class LogEntry(_Model):
    offset: int
    """The entry's place in the sandbox's log (0 is the first line it ever had)."""
    timestamp: float
    level: LogLevel
    source: LogSource
    """``console``: the guest's serial console; ``agent``: the host agent about the sandbox."""
    message: str


class LogPage(_Model):
    """A page of entries; ``next_offset`` continues in the query's direction; ``dropped`` counts the oldest
    entries no longer kept (the first kept is at that offset)."""

    entries: list[LogEntry]
    next_offset: int
    dropped: int = 0


COUNTER_FIELDS: tuple[str, ...] = (
    "faults",
    "chunk_fetches",
    "zero_fills",
    "cache_hits",
    "prefetch_hits",
    "prefetch_chunks",
    "store_gets",
    "chunk_fetch_failures",
)
"""The cumulative counters of :class:`AgentCounters`, in the order they are shown."""


class AgentCounters(_Model):
    """The host's counters as its memory server exports them (``faults_total``, ``chunk_fetches_total``...:
    :mod:`cryobox.agent.memory.server.metrics`), cumulative since that server started (a restart starts them
    from 0 again), and the chunk cache's size now. A fixed set of numbers: the answer's size is bounded."""

    faults: int = Field(default=0, ge=0)
    """Reads of memory images served (page faults reaching the resolver)."""
    chunk_fetches: int = Field(default=0, ge=0)
    """Chunks fetched from the object store and verified."""
    zero_fills: int = Field(default=0, ge=0)
    cache_hits: int = Field(default=0, ge=0)
    """Chunks served from the local chunk cache."""
    prefetch_hits: int = Field(default=0, ge=0)
    prefetch_chunks: int = Field(default=0, ge=0)
    store_gets: int = Field(default=0, ge=0)
    """GET attempts against the object store, retries included."""
    chunk_fetch_failures: int = Field(default=0, ge=0)
    chunk_cache_bytes: int = Field(default=0, ge=0)
    """Bytes the chunk cache holds now (a gauge, not a counter)."""
