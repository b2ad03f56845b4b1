"""The pure parts of ``cryobox bench fleet`` (unit-tested): percentiles of the hop, the burst's per-agent figures,
the restores' classification, and the keys the JSON result promises."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .stats import percentile, permutation_p

HOP_KEYS = tuple(
    f"{op}_{q}_ms_{side}" for op in ("create", "exec") for q in ("p50", "p99") for side in ("inproc", "http")
)
BURST_KEYS = ("n", "per_agent", "store_gets_per_agent", "unique_chunks_per_agent")
TOP_KEYS = ("hop", "burst", "cross_host_restore_ok", "cross_host_restore_p50_ms", "same_host_restore_p50_ms")
HOP_OPS = ("create", "first_exec", "exec", "create_agent", "exec_agent")
SIGNIFICANT = 0.01
"""A hop difference counts as real below this p-value (medians compared by a permutation test)."""
_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def quantile(samples: Sequence[float], q: float) -> float | None:
    return round(percentile(list(samples), q), 1) if samples else None


def hop_summary(inproc: Mapping[str, Sequence[float]], http: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """``{op}_{p50,p99}_ms_{inproc,http}``, the HTTP hop's added p50 (ms), and whether that difference is real:
    ``{op}_hop_p_value`` (a permutation test of the medians) and ``{op}_hop_significant``; for ``create``,
    ``first_exec``, ``exec``, and ``create_agent``/``exec_agent`` (their ``Server-Timing`` agent step)."""
    out: dict[str, Any] = {"k": len(inproc.get("create_ms", ()))}
    for op in HOP_OPS:
        for q in (50, 99):
            for side, samples in (("inproc", inproc), ("http", http)):
                out[f"{op}_p{q}_ms_{side}"] = quantile(samples.get(f"{op}_ms", ()), q)
        a, b = out[f"{op}_p50_ms_http"], out[f"{op}_p50_ms_inproc"]
        out[f"{op}_hop_p50_ms"] = round(a - b, 1) if a is not None and b is not None else None
        p = permutation_p(list(inproc.get(f"{op}_ms", ())), list(http.get(f"{op}_ms", ())))
        out[f"{op}_hop_p_value"] = round(p, 4) if p is not None else None
        out[f"{op}_hop_significant"] = p is not None and p < SIGNIFICANT
    out["samples_ms"] = {
        side: {key: [round(x, 1) for x in values] for key, values in samples.items()}
        for side, samples in (("inproc", inproc), ("http", http))
    }
    return out


def host_to_agent(host: str | None, agents: Mapping[str, Mapping[str, Any]]) -> str:
    """Which agent a sandbox's ``host`` names: an agent name, its URL, or its URL's ``host:port``."""
    if not host:
        return "?"
    if host in agents:
        return host
    for name, agent in agents.items():
        url = str(agent.get("url", "")).rstrip("/")
        if url and (host.rstrip("/") == url or url.endswith(f"//{host}")):
            return name
    return host


def per_agent_counts(hosts: Iterable[str], names: Sequence[str]) -> dict[str, int]:
    """Sandboxes per agent: every fleet agent (0 when none landed there), plus any other host seen."""
    counts = dict.fromkeys(names, 0)
    for host in hosts:
        counts[host] = counts.get(host, 0) + 1
    return counts


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {series name: value summed over its labels} (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def memserver_figures(stats: Mapping[str, Any]) -> dict[str, int]:
    """From a memory server's ``GET /stats``: store GETs, unique stored chunks touched (over every image), faults,
    chunk fetches."""
    metrics = stats.get("metrics", {})
    images = stats.get("images", {})
    return {
        "store_gets": int(metrics.get("store_gets", 0)),
        "unique_chunks": sum(int(image.get("touched_stored", 0)) for image in images.values()),
        "faults": int(metrics.get("faults", 0)),
        "chunk_fetches": int(metrics.get("chunk_fetches", 0)),
    }


def figures_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Counters are deltas over the burst; ``unique_chunks`` is a set size, so it is the value after."""
    return {k: (v if k == "unique_chunks" else v - int(before.get(k, 0))) for k, v in after.items()}


def burst_summary(
    n: int,
    latencies_ms: Sequence[float],
    hosts: Sequence[str],
    names: Sequence[str],
    figures: Mapping[str, Mapping[str, int | None]],
    errors: Sequence[str] = (),
) -> dict[str, Any]:
    def column(key: str) -> dict[str, int | None]:
        return {name: figures.get(name, {}).get(key) for name in names}

    return {
        "n": n,
        "agents": len(names),
        "ok": len(latencies_ms),
        "errors": len(errors),
        "first_errors": list(errors[:3]),
        "per_agent": per_agent_counts(hosts, names),
        "store_gets_per_agent": column("store_gets"),
        "unique_chunks_per_agent": column("unique_chunks"),
        "faults_per_agent": column("faults"),
        "chunk_fetches_per_agent": column("chunk_fetches"),
        "p50_ms": quantile(latencies_ms, 50),
        "p90_ms": quantile(latencies_ms, 90),
        "p99_ms": quantile(latencies_ms, 99),
        "max_ms": round(max(latencies_ms), 1) if latencies_ms else None,
        "latencies_ms": [round(x, 1) for x in sorted(latencies_ms)],
    }


def classify_restores(samples: Sequence[Mapping[str, Any]], source_host: str) -> list[dict[str, Any]]:
    """Label each restore, in order: ``same-host`` (on the host that took the snapshot), ``cross-host`` (the first
    time that other host restores that snapshot: it imports it and pages its memory from the store) or
    ``cross-host-repeat`` (that host already holds the snapshot from an earlier restore)."""
    seen: set[tuple[str, object]] = set()
    out = []
    for sample in samples:
        host, key = str(sample.get("host")), sample.get("snapshot", 0)
        if host == source_host:
            kind = "same-host"
        elif (host, key) in seen:
            kind = "cross-host-repeat"
        else:
            kind = "cross-host"
        if sample.get("ok"):
            seen.add((host, key))
        out.append({**sample, "kind": kind})
    return out


def restore_summary(samples: Sequence[Mapping[str, Any]], source_host: str) -> dict[str, Any]:
    """Samples ``{host, ms, ok, phase, snapshot}`` -> p50s by kind (see :func:`classify_restores`) and whether
    every restore away from the source host worked (``cross_host_restore_ok`` is False when there was none)."""
    labelled = classify_restores(samples, source_host)

    def p50(kind: str) -> float | None:
        return quantile([float(s["ms"]) for s in labelled if s["kind"] == kind and s.get("ok")], 50)

    away = [s for s in labelled if s["kind"] != "same-host"]
    return {
        "source_host": source_host,
        "same_host": sum(1 for s in labelled if s["kind"] == "same-host"),
        "cross_host": sum(1 for s in labelled if s["kind"] == "cross-host"),
        "cross_host_repeat": sum(1 for s in labelled if s["kind"] == "cross-host-repeat"),
        "same_host_restore_p50_ms": p50("same-host"),
        "cross_host_restore_p50_ms": p50("cross-host"),
        "cross_host_repeat_p50_ms": p50("cross-host-repeat"),
        "cross_host_restore_ok": any(s["kind"] == "cross-host" for s in away) and all(bool(s.get("ok")) for s in away),
        "samples": labelled,
    }


def assemble(
    hop: Mapping[str, Any], burst: Mapping[str, Any], restore: Mapping[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "hop": dict(hop),
        "burst": dict(burst),
        "cross_host_restore_ok": restore["cross_host_restore_ok"],
        "cross_host_restore_p50_ms": restore["cross_host_restore_p50_ms"],
        "same_host_restore_p50_ms": restore["same_host_restore_p50_ms"],
        "restore": dict(restore),
        **extra,
    }


def missing_keys(result: Mapping[str, Any]) -> list[str]:
    """Promised keys absent from ``result`` (empty when the shape is complete)."""
    missing = [k for k in TOP_KEYS if k not in result]
    missing += [f"hop.{k}" for k in HOP_KEYS if k not in result.get("hop", {})]
    missing += [f"burst.{k}" for k in BURST_KEYS if k not in result.get("burst", {})]
    return missing
