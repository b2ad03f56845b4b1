"""The host agent's own Prometheus series, in a registry of their own (never the global one, never the control
plane's): today the admission queue in front of restores. ``Agent.metrics_text`` serves them beside the memory
server's; ``cryobox serve`` appends that text to its ``/metrics``, ``cryobox agent`` serves it at
``/agent/v1/metrics``."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

ADMISSION_WAIT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AgentMetrics:
    """The agent's collectors; also the admission controller's observer
    (:class:`~cryobox.agent.sandbox.admission.AdmissionObserver`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        self.admission_queue_depth = Gauge(
            "cryobox_admission_queue_depth", "Create requests waiting for a restore slot", registry=self.registry
        )
        self.admission_wait_seconds = Histogram(
            "cryobox_admission_wait_seconds",
            "Time spent waiting for a restore slot",
            ["admitted"],
            buckets=ADMISSION_WAIT_BUCKETS,
            registry=self.registry,
        )
        for admitted in ("true", "false"):  # exported from the start, so rates work before the first event
            self.admission_wait_seconds.labels(admitted=admitted)

    def on_wait(self, seconds: float, admitted: bool) -> None:
        self.admission_wait_seconds.labels(admitted="true" if admitted else "false").observe(seconds)

    def on_queue_depth(self, depth: int) -> None:
        self.admission_queue_depth.set(depth)

    async def text(self) -> str:
        """The text exposition of these series."""
        return generate_latest(self.registry).decode()
