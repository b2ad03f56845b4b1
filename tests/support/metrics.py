"""Reading counters back from a Prometheus registry."""

from __future__ import annotations

from cryobox.agent.hostagent.metrics import AgentMetrics
from cryobox.server.metrics import Metrics


def sample(metrics: Metrics | AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def requests_total(metrics: Metrics, route: str, method: str, status: str) -> float:
    return sample(metrics, "cryobox_http_requests_total", route=route, method=method, status=status) or 0.0
