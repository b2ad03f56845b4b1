"""Wire models of a sandbox's samples (``/v1/sandboxes/{id}/metrics``) and log (``/v1/sandboxes/{id}/logs``), shared
by the server and the SDK. Imported into :mod:`cryobox.models` (use them from there). Times are epoch seconds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LogLevel = Literal["debug", "info", "warn", "error"]
MAX_LOG_LIMIT = 1000
"""The most entries one ``GET /v1/sandboxes/{id}/logs`` returns (``limit``, default 100)."""


class MetricSample(BaseModel):
    """One sample of a running sandbox (taken by its agent every few seconds; paused and hibernated sandboxes are
    not sampled). ``cpu_pct`` and ``memory_bytes`` are measured on the host; ``mem_*`` and ``disk_*`` are the
    guest's own view (``guest_view`` false: the guest did not answer, ``mem_*`` are then the VM's RAM and the
    host's figure)."""

    model_config = ConfigDict(frozen=True)

    timestamp: float
    cpu_count: int
    cpu_pct: float
    """CPU used over the interval before the sample, per vCPU, 0-100."""
    memory_bytes: int
    """Memory the host charges the sandbox's VM for."""
    mem_total: int
    mem_used: int
    mem_cache: int = 0
    disk_total: int = 0
    disk_used: int = 0
    guest_view: bool = True


class SandboxMetrics(BaseModel):
    """``GET /v1/sandboxes/{id}/metrics``: the samples in ``[start, end]``, oldest first; ``dropped`` counts older
    ones no longer kept (the agent keeps about an hour)."""

    model_config = ConfigDict(frozen=True)

    sandbox_id: str
    interval_seconds: float
    samples: list[MetricSample] = Field(default_factory=list)
    dropped: int = 0


class SandboxLogEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    offset: int
    """The entry's place in the sandbox's log (0: the first line it ever had)."""
    timestamp: float
    level: LogLevel
    source: Literal["console", "agent"]
    """``console``: the guest's serial console; ``agent``: the host agent about the sandbox (started, paused,
    hibernated, woken, network policy changed, …)."""
    message: str


class SandboxLogs(BaseModel):
    """``GET /v1/sandboxes/{id}/logs``: a page; ask again with ``offset=next_offset`` (same ``direction``) for the
    next; ``dropped`` counts the oldest entries no longer kept."""

    model_config = ConfigDict(frozen=True)

    sandbox_id: str
    logs: list[SandboxLogEntry] = Field(default_factory=list)
    next_offset: int
    dropped: int = 0


__all__ = ["MAX_LOG_LIMIT", "LogLevel", "MetricSample", "SandboxLogEntry", "SandboxLogs", "SandboxMetrics"]
