"""The egress service's Prometheus series, in a registry of their own (served beside the agent's): every decision
counted by outcome and reason, and the bytes allowed connections moved. Per-sandbox detail is in the decision
log, never in labels (sandbox ids would make the series unbounded)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

REASONS = (
    "floor",
    "port",
    "deny-name",
    "deny-cidr",
    "allow-name",
    "allow-cidr",
    "default",
    "unresolved",
    "limit",
    "dns",
)


class EgressMetrics:
    """A :class:`~.decisions.DecisionObserver` that counts."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.decisions = Counter(
            "cryobox_egress_decisions",
            "Egress connections and DNS queries judged by sandboxes' network policies",
            ["decision", "reason"],
            registry=self.registry,
        )
        self.bytes = Counter(
            "cryobox_egress_bytes", "Bytes moved by allowed egress connections", ["direction"], registry=self.registry
        )
        for reason in REASONS:  # exported from the start, so rates work before the first event
            self.decisions.labels(decision="denied", reason=reason)
        for direction in ("out", "in"):
            self.bytes.labels(direction=direction)

    def on_decision(self, allowed: bool, reason: str) -> None:
        self.decisions.labels(decision="allowed" if allowed else "denied", reason=reason).inc()

    def on_bytes(self, sent: int, received: int) -> None:
        self.bytes.labels(direction="out").inc(sent)
        self.bytes.labels(direction="in").inc(received)

    async def text(self) -> str:
        return generate_latest(self.registry).decode()


__all__ = ["EgressMetrics"]
