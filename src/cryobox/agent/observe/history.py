"""Each sandbox's recent samples on this host (bounded in count per sandbox and in total, :mod:`.rings`), read by
time range, and their newest figures as Prometheus series."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ...agentapi.models_obs import MetricSample, MetricSeries
from .rings import RingBounds, Rings


@dataclass(frozen=True, slots=True)
class Sample:
    timestamp: float
    cpu_count: int
    cpu_pct: float
    memory_bytes: int
    mem_total: int
    mem_used: int
    mem_cache: int
    disk_total: int
    disk_used: int
    guest_view: bool

    def wire(self) -> MetricSample:
        return MetricSample(
            timestamp=self.timestamp,
            cpu_count=self.cpu_count,
            cpu_pct=self.cpu_pct,
            memory_bytes=self.memory_bytes,
            mem_total=self.mem_total,
            mem_used=self.mem_used,
            mem_cache=self.mem_cache,
            disk_total=self.disk_total,
            disk_used=self.disk_used,
            guest_view=self.guest_view,
        )


class SampleHistory:
    def __init__(self, per_sandbox: int, total: int, interval_s: float) -> None:
        self.interval_s = interval_s
        self._rings: Rings[Sample] = Rings(RingBounds(per_sandbox, per_sandbox, total))

    def add(self, sandbox_id: str, sample: Sample) -> None:
        self._rings.add(sandbox_id, sample)

    def keep_only(self, sandbox_ids: Iterable[str]) -> list[str]:
        return self._rings.keep_only(sandbox_ids)

    def forget(self, sandbox_id: str) -> None:
        self._rings.forget(sandbox_id)

    @property
    def total(self) -> int:
        return self._rings.total_weight

    def latest(self, sandbox_id: str) -> Sample | None:
        ring = self._rings.get(sandbox_id)
        return ring.items[-1] if ring is not None and ring.items else None

    def series(self, sandbox_id: str, start: float | None = None, end: float | None = None) -> MetricSeries:
        """The samples taken in ``[start, end]`` (either open), oldest first."""
        ring = self._rings.get(sandbox_id)
        items = list(ring.items) if ring is not None else []
        chosen = [
            s.wire() for s in items if (start is None or s.timestamp >= start) and (end is None or s.timestamp <= end)
        ]
        return MetricSeries(
            sandbox_id=sandbox_id,
            interval_s=self.interval_s,
            samples=chosen,
            dropped=ring.dropped if ring is not None else 0,
        )

    def newest(self) -> dict[str, Sample]:
        return {key: latest for key in self._rings.keys() if (latest := self.latest(key)) is not None}


class _Newest(Collector):
    """The newest sample of every sandbox, as gauges labelled with its id, read at each scrape."""

    def __init__(self, history: SampleHistory) -> None:
        self.history = history

    def collect(self) -> Iterable[GaugeMetricFamily]:
        cpu = GaugeMetricFamily(
            "cryobox_sandbox_cpu_percent", "A sandbox's CPU use per vCPU at its newest sample", labels=["sandbox"]
        )
        memory = GaugeMetricFamily(
            "cryobox_sandbox_memory_bytes",
            "Memory the host charges a sandbox's VM for at its newest sample",
            labels=["sandbox"],
        )
        for sandbox_id, sample in sorted(self.history.newest().items()):
            cpu.add_metric([sandbox_id], sample.cpu_pct)
            memory.add_metric([sandbox_id], float(sample.memory_bytes))
        held = GaugeMetricFamily("cryobox_sandbox_samples", "Samples the agent keeps, all sandboxes together")
        held.add_metric([], float(self.history.total))
        return [cpu, memory, held]


def prometheus_text(history: SampleHistory) -> str:
    registry = CollectorRegistry()
    registry.register(_Newest(history))
    return generate_latest(registry).decode()
