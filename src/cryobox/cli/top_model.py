"""What ``cryobox top`` shows, without I/O: the herd counters read from a ``/metrics`` text exposition, their
per-second rates between two scrapes, and a frame (sandboxes, agents, counters) as rich tables or as JSON.

Counter names are the exposed ones: the memory server's (:mod:`cryobox.agent.memory.server.metrics`, appended to the
control plane's scrape) and the control plane's create counter and latency histogram
(:mod:`cryobox.server.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table

from .. import models

# the key ``top`` shows -> the exposed sample summed over its labels
COUNTER_SAMPLES: Final = {
    "faults": "faults_total",
    "chunk_fetches": "chunk_fetches_total",
    "cache_hits": "cache_hits_total",
    "store_gets": "store_gets_total",
    "creates": "cryobox_creates_total",
    "create_seconds_sum": "cryobox_create_duration_seconds_sum",
    "create_seconds_count": "cryobox_create_duration_seconds_count",
}
RATE_KEYS: Final = ("faults", "chunk_fetches", "cache_hits", "store_gets", "creates")


def parse_counters(text: str) -> dict[str, float]:
    """The :data:`COUNTER_SAMPLES` of a text exposition, each summed over its label sets (0 when absent)."""
    wanted = {sample: key for key, sample in COUNTER_SAMPLES.items()}
    counters = dict.fromkeys(COUNTER_SAMPLES, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                counters[key] += float(sample.value)
    return counters


@dataclass(frozen=True)
class Scrape:
    at: float
    """Seconds (the command's clock) when the counters were read."""
    counters: dict[str, float]


def rates(previous: Scrape | None, current: Scrape) -> dict[str, float | None]:
    """Per-second increase of each :data:`RATE_KEYS` counter since ``previous`` (``None`` on the first frame), and
    ``create_latency_ms``: the mean latency of the creates that finished in between (``None`` if there were none).
    A counter that went down (the server restarted) counts from zero."""
    result: dict[str, float | None] = dict.fromkeys(RATE_KEYS)
    result["create_latency_ms"] = None
    if previous is None or current.at <= previous.at:
        return result
    elapsed = current.at - previous.at

    def delta(key: str) -> float:
        now, before = current.counters.get(key, 0.0), previous.counters.get(key, 0.0)
        return now - before if now >= before else now

    for key in RATE_KEYS:
        result[key] = round(delta(key) / elapsed, 3)
    count = delta("create_seconds_count")
    if count > 0:
        result["create_latency_ms"] = round(delta("create_seconds_sum") / count * 1000, 1)
    return result


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def duration(seconds: float | None) -> str:
    """``None`` -> ``-``; else the two largest units (``45s``, ``3m05s``, ``2h10m``, ``4d03h``)."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


@dataclass(frozen=True)
class Frame:
    now: float
    """Wall-clock seconds the frame was taken (ages and TTLs are relative to it)."""
    sandboxes: list[models.Sandbox]
    agents: list[dict[str, Any]]
    counters: dict[str, float]
    rates: dict[str, float | None] = field(default_factory=dict)

    def sandbox_rows(self) -> list[dict[str, Any]]:
        rows = []
        for s in self.sandboxes:
            created, expires = _epoch(s.created_at), _epoch(s.expires_at)
            rows.append(
                {
                    "id": s.id,
                    "template": s.template,
                    "state": s.status,
                    "host": s.host,
                    "age_s": None if created is None else round(self.now - created, 1),
                    "ttl_left_s": None if expires is None else round(expires - self.now, 1),
                    "vcpus": s.cpu,
                    "memory_mb": s.memory_mb,
                }
            )
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.now,
            "sandboxes": self.sandbox_rows(),
            "agents": self.agents,
            "counters": self.counters,
            "rates": self.rates,
        }


def _rate(value: float | None, unit: str = "/s") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def render(frame: Frame) -> Group:
    """The frame as three tables: sandboxes, agents (capacity), herd counters with their rates."""
    sandboxes = Table("id", "template", "state", "host", "age", "ttl left", "vcpus", "memory", title="sandboxes")
    for row in frame.sandbox_rows():
        sandboxes.add_row(
            row["id"],
            row["template"],
            row["state"],
            row["host"] or "-",
            duration(row["age_s"]),
            duration(row["ttl_left_s"]) if row["ttl_left_s"] is not None else "never",
            str(row["vcpus"]),
            f"{row['memory_mb']} MB",
        )
    agents = Table("agent", "status", "sandboxes", "vcpus", "memory MiB", "prespawned", title="agents")
    for agent in frame.agents:
        cap = agent.get("capacity") or {}
        agents.add_row(
            str(agent.get("name")),
            str(agent.get("status")),
            f"{cap.get('sandboxes', '?')}/{cap.get('max_sandboxes', '?')}",
            f"{cap.get('vcpus_committed', '?')}/{cap.get('vcpus_total', '?')}",
            f"{cap.get('memory_committed_mib', '?')}/{cap.get('memory_total_mib', '?')}",
            str(cap.get("prespawned", "?")),
        )
    counters = Table("counter", "total", "rate", title="herd")
    for key in RATE_KEYS:
        counters.add_row(key, f"{frame.counters.get(key, 0.0):g}", _rate(frame.rates.get(key)))
    counters.add_row("create latency", "", _rate(frame.rates.get("create_latency_ms"), " ms"))
    return Group(sandboxes, agents, counters)
