"""What ``cryobox top`` shows, without I/O: the herd counters read from a ``/metrics`` text exposition, their
per-second rates between two scrapes, and a frame (sandboxes, agents with their own counters, counters) as rich
tables or as JSON.

Counter names are the exposed ones: the memory servers' counters of every live agent as the control plane gathers
them (``cryobox_fleet_<counter>_total``, and per agent ``cryobox_agent_<counter>_total{agent}`` with
``cryobox_agent_counters_up{agent}``: :mod:`cryobox.server.control.counters`) and the control plane's create
counter and latency histogram (:mod:`cryobox.server.metrics`).
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
HERD_KEYS: Final = ("faults", "chunk_fetches", "cache_hits", "store_gets")
COUNTER_SAMPLES: Final = {
    **{key: f"cryobox_fleet_{key}_total" for key in HERD_KEYS},
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


AGENT_SAMPLES: Final = {f"cryobox_agent_{key}_total": key for key in HERD_KEYS}
AGENT_UP: Final = "cryobox_agent_counters_up"


def parse_agent_counters(text: str) -> dict[str, dict[str, Any]]:
    """Each agent's :data:`HERD_KEYS` and ``up`` (it answered the control plane's last gather; when not, the
    counters are the ones it last gave) from a text exposition, by agent name."""
    agents: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in AGENT_SAMPLES or sample.name == AGENT_UP:
                row = agents.setdefault(sample.labels.get("agent", ""), {"up": False})
                if sample.name == AGENT_UP:
                    row["up"] = sample.value == 1
                else:
                    row[AGENT_SAMPLES[sample.name]] = float(sample.value)
    return agents


@dataclass(frozen=True)
class Scrape:
    at: float
    """Seconds (the command's clock) when the counters were read."""
    counters: dict[str, float]
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    """:func:`parse_agent_counters` of the same scrape."""


def _delta(now: float, before: float) -> float:
    return now - before if now >= before else now


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
        return _delta(current.counters.get(key, 0.0), previous.counters.get(key, 0.0))

    for key in RATE_KEYS:
        result[key] = round(delta(key) / elapsed, 3)
    count = delta("create_seconds_count")
    if count > 0:
        result["create_latency_ms"] = round(delta("create_seconds_sum") / count * 1000, 1)
    return result


def with_counters(agents: list[dict[str, Any]], previous: Scrape | None, current: Scrape) -> list[dict[str, Any]]:
    """``agents`` (the objects of ``GET /v1/agents``) each with ``counters`` (its :data:`HERD_KEYS` as the control
    plane last gathered them; ``None`` when it gathered none: the agent is not live, or never answered),
    ``counters_up`` (it answered the last gather) and ``counter_rates`` (per second since ``previous``; ``None``
    on the first frame or when either scrape lacks the agent; a counter that went down counts from zero)."""
    elapsed = current.at - previous.at if previous is not None else 0.0
    out = []
    for agent in agents:
        name = str(agent.get("name"))
        now = current.agents.get(name)
        before = previous.agents.get(name) if previous is not None else None
        counters = None if now is None else {key: now.get(key, 0.0) for key in HERD_KEYS}
        agent_rates: dict[str, float | None] = dict.fromkeys(HERD_KEYS)
        if now is not None and before is not None and elapsed > 0:
            for key in HERD_KEYS:
                agent_rates[key] = round(_delta(now.get(key, 0.0), before.get(key, 0.0)) / elapsed, 3)
        up = bool(now is not None and now.get("up"))
        out.append({**agent, "counters": counters, "counters_up": up, "counter_rates": agent_rates})
    return out


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


AGENT_COLUMNS: Final = {"faults": "faults", "chunk_fetches": "fetches", "cache_hits": "hits", "store_gets": "GETs"}


def _agent_counter_cells(agent: dict[str, Any]) -> list[str]:
    """Each herd counter's total and rate; ``-`` when the control plane has none of the agent's, and the counters it
    last gave marked ``(no answer)`` when it did not answer the last gather."""
    counters = agent.get("counters")
    if not isinstance(counters, dict):
        return ["-"] * len(AGENT_COLUMNS)
    agent_rates = agent.get("counter_rates") or {}
    cells = []
    for key in AGENT_COLUMNS:
        rate = agent_rates.get(key)
        cells.append(f"{counters.get(key, 0.0):g}" + ("" if rate is None else f" ({_rate(rate)})"))
    if not agent.get("counters_up"):
        cells[-1] += " (no answer)"
    return cells


def render(frame: Frame) -> Group:
    """The frame as three tables: sandboxes, agents (capacity, their own herd counters), herd counters with their
    rates (every live agent's summed)."""
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
    agents = Table(
        "agent", "status", "sandboxes", "vcpus", "memory MiB", "prespawned", *AGENT_COLUMNS.values(), title="agents"
    )
    for agent in frame.agents:
        cap = agent.get("capacity") or {}
        agents.add_row(
            str(agent.get("name")),
            str(agent.get("status")),
            f"{cap.get('sandboxes', '?')}/{cap.get('max_sandboxes', '?')}",
            f"{cap.get('vcpus_committed', '?')}/{cap.get('vcpus_total', '?')}",
            f"{cap.get('memory_committed_mib', '?')}/{cap.get('memory_total_mib', '?')}",
            str(cap.get("prespawned", "?")),
            *_agent_counter_cells(agent),
        )
    counters = Table("counter", "total", "rate", title="herd")
    for key in RATE_KEYS:
        counters.add_row(key, f"{frame.counters.get(key, 0.0):g}", _rate(frame.rates.get(key)))
    counters.add_row("create latency", "", _rate(frame.rates.get("create_latency_ms"), " ms"))
    return Group(sandboxes, agents, counters)
