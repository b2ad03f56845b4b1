"""The pure parts of ``cryobox bench net``'s egress section (unit-tested): the samples, the figures and ratios
merged into the bench net JSON (new keys only, all prefixed ``egress_``), their notes and the table.

The paths compared: ``direct`` is a guest namespace routed by the host kernel with nothing deciding, ``proxied``
a real slot whose guest's TCP goes through the agents' egress enforcement in ``egress_mode``: ``forward`` (its
first packets queued to the egress gate, the rest forwarded by the kernel) or ``proxy`` (redirected to the egress
proxy, which connects from the host). The key names stay ``proxied`` whichever mode ran.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from .snapshot_report import BenchError
from .snapshot_result import stats_n
from .stats import percentile

PATHS = ("direct", "proxied")
CONNECT_DELTA_TARGET_MS = 1.0
"""The proxy may add at most this to a connection's time to first byte (p50)."""
THROUGHPUT_RATIO_TARGET = 0.8
"""One proxied connection must move at least this fraction of what a directly routed one moves (best runs)."""

EGRESS_NOTES = {
    "egress_connect_p50_ms": (
        "from connect() to the server's first byte (it sends one at once), p50 over the alternating connections "
        "of each path; delta = proxied - direct (target <= +1 ms). direct: a guest namespace routed by the host "
        "kernel (ip_forward) with nothing deciding; proxied: a real slot whose fake guest's TCP goes through "
        "the egress enforcement of egress_mode (policy: allow the server's /30): forward = the egress gate decides "
        "from the first packets and the kernel forwards the rest; proxy = the egress proxy connects from the host"
    ),
    "egress_mode": "CRYOBOX_EGRESS_MODE of the run (the agents' setting): forward (the default) or proxy",
    "egress_connect_p95_ms": "as egress_connect_p50_ms, p95",
    "egress_connect_ms": "full statistics of those samples, per path",
    "egress_http_p50_ms": (
        "one HTTP/1.1 GET / with Host: bench.example, from connect() to the whole response (Content-Length), p50; "
        "proxied under a name rule (allow bench.example): the gate or proxy reads the Host and resolves the name "
        "(cached after the warm-up; a name server in the server's namespace answers); the gate lets the connection "
        "on when the address is the name's, the proxy connects to what it resolved"
    ),
    "egress_http_ms": "full statistics of those samples, per path",
    "egress_throughput_mbps": (
        "one connection receiving egress_bulk_bytes from the server, MB/s (1e6 bytes/s), best and median of the "
        "runs per path (alternating); ratio = proxied / direct of the best runs (target >= 0.8), ratio_median "
        "of the medians. The size is at least 2 GiB and what the direct path moves in 3 s"
    ),
    "egress_client": (
        "where the client ran: 'process' = a process of its own that setns()-es into the guest namespaces (the "
        "figures above); egress_in_process = the same client on a thread of the bench process, which also runs "
        "the proxy's event loop (GIL contention between the two)"
    ),
    "egress_proxied_connections": "connections the gate or proxy allowed (its counters): every proxied one was decided",
}


@dataclass
class EgressSamples:
    """Raw measurements of the egress section (what :func:`build_egress_result` summarises)."""

    server_cidr: str = ""
    slot_cidr: str = ""
    connect_ms: dict[str, list[float]] = field(default_factory=dict)
    http_ms: dict[str, list[float]] = field(default_factory=dict)
    throughput_mbps: dict[str, list[float]] = field(default_factory=dict)
    bulk_bytes: int = 0
    in_process_connect_ms: dict[str, list[float]] = field(default_factory=dict)
    in_process_throughput_mbps: dict[str, list[float]] = field(default_factory=dict)
    in_process_bulk_bytes: int = 0
    proxied_connections: int = 0
    ip_forward_was: str = ""
    mode: str = ""


def _paths(samples: dict[str, list[float]], what: str) -> None:
    missing = [p for p in PATHS if not samples.get(p)]
    if missing:
        raise BenchError(f"egress: no {what} samples for {', '.join(missing)}")


def compare_latency(samples: dict[str, list[float]], q: float) -> dict[str, float]:
    """``{direct, proxied, delta}``: the ``q`` percentile of each path's ms, and what the proxy adds."""
    direct, proxied = percentile(samples["direct"], q), percentile(samples["proxied"], q)
    return {"direct": round(direct, 3), "proxied": round(proxied, 3), "delta": round(proxied - direct, 3)}


def compare_throughput(samples: dict[str, list[float]]) -> dict[str, float]:
    """Best and median MB/s of each path, and the proxied/direct ratios of both."""
    best = {p: max(samples[p]) for p in PATHS}
    median = {p: statistics.median(samples[p]) for p in PATHS}
    return {
        "direct": round(best["direct"], 1),
        "proxied": round(best["proxied"], 1),
        "ratio": round(best["proxied"] / best["direct"], 3),
        "direct_median": round(median["direct"], 1),
        "proxied_median": round(median["proxied"], 1),
        "ratio_median": round(median["proxied"] / median["direct"], 3),
        "runs": len(samples["direct"]),
    }


def _per_path(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {p: stats_n(samples[p]) for p in PATHS}


def _rounded(samples: dict[str, list[float]], digits: int) -> dict[str, list[float]]:
    return {p: [round(v, digits) for v in samples.get(p, [])] for p in PATHS}


def build_egress_result(s: EgressSamples) -> dict[str, Any]:
    """The keys the egress section adds to the bench net JSON."""
    _paths(s.connect_ms, "connect")
    _paths(s.http_ms, "HTTP")
    _paths(s.throughput_mbps, "throughput")
    connect = compare_latency(s.connect_ms, 50)
    throughput = compare_throughput(s.throughput_mbps)
    result: dict[str, Any] = {
        "egress_mode": s.mode,
        "egress_server_cidr": s.server_cidr,
        "egress_slot_cidr": s.slot_cidr,
        "egress_client": "process",
        "egress_connect_p50_ms": connect,
        "egress_connect_p95_ms": compare_latency(s.connect_ms, 95),
        "egress_connect_ms": _per_path(s.connect_ms),
        "egress_http_p50_ms": compare_latency(s.http_ms, 50),
        "egress_http_ms": _per_path(s.http_ms),
        "egress_throughput_mbps": throughput,
        "egress_bulk_bytes": s.bulk_bytes,
        "egress_targets": {
            "connect_delta_ms_max": CONNECT_DELTA_TARGET_MS,
            "connect_delta_met": connect["delta"] <= CONNECT_DELTA_TARGET_MS,
            "throughput_ratio_min": THROUGHPUT_RATIO_TARGET,
            "throughput_ratio_met": throughput["ratio"] >= THROUGHPUT_RATIO_TARGET,
        },
        "egress_proxied_connections": s.proxied_connections,
        "egress_samples": {
            "connect_ms": _rounded(s.connect_ms, 3),
            "http_ms": _rounded(s.http_ms, 3),
            "throughput_mbps": _rounded(s.throughput_mbps, 1),
        },
    }
    if all(s.in_process_connect_ms.get(p) for p in PATHS) and all(s.in_process_throughput_mbps.get(p) for p in PATHS):
        result["egress_in_process"] = {
            "connect_p50_ms": compare_latency(s.in_process_connect_ms, 50),
            "connect_p95_ms": compare_latency(s.in_process_connect_ms, 95),
            "throughput_mbps": compare_throughput(s.in_process_throughput_mbps),
            "bulk_bytes": s.in_process_bulk_bytes,
        }
    return result


def _fmt(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"


def egress_table(result: dict[str, Any]) -> Table:
    """Direct vs proxied, side by side, with what the proxy adds and the target."""
    targets = result["egress_targets"]
    table = Table(title=f"egress enforcement ({result.get('egress_mode') or 'proxy'}) vs direct routing (no VM)")
    for col in ("metric", "direct", "proxied", "proxied vs direct", "target"):
        table.add_column(col, justify="left" if col == "metric" else "right")

    def latency(label: str, c: dict[str, float], target: str = "") -> None:
        table.add_row(label, _fmt(c["direct"]), _fmt(c["proxied"]), f"{c['delta']:+.3f} ms", target)

    def throughput(label: str, t: dict[str, float], target: str = "") -> None:
        table.add_row(label, _fmt(t["direct"]), _fmt(t["proxied"]), f"x{t['ratio']:.2f}", target)
        table.add_row("  median", _fmt(t["direct_median"]), _fmt(t["proxied_median"]), f"x{t['ratio_median']:.2f}", "")

    mark = {True: "met", False: "MISSED"}
    latency(
        "connect → first byte p50 ms",
        result["egress_connect_p50_ms"],
        f"<= +{targets['connect_delta_ms_max']:g} ms {mark[targets['connect_delta_met']]}",
    )
    latency("connect → first byte p95 ms", result["egress_connect_p95_ms"])
    latency("HTTP GET (Host, name rule) p50 ms", result["egress_http_p50_ms"])
    throughput(
        f"throughput MB/s ({result['egress_bulk_bytes'] / 2**30:g} GiB)",
        result["egress_throughput_mbps"],
        f">= x{targets['throughput_ratio_min']:g} {mark[targets['throughput_ratio_met']]}",
    )
    inproc = result.get("egress_in_process")
    if inproc:
        latency("client in the bench process: connect p50", inproc["connect_p50_ms"])
        throughput("  throughput MB/s", inproc["throughput_mbps"])
    table.caption = f"{result['egress_proxied_connections']} connections decided by the gate or proxy"
    return table
