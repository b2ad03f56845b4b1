"""The pure parts of ``cryobox bench restart`` (unit-tested): the exec unavailability window from client samples,
summary statistics in seconds, survival and drain summaries, the targets block, the chaos block, the result shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..stats import percentile

UPGRADE = "upgrade"
KINDS = ("sigkill", UPGRADE, "sigterm")
"""Restart kinds, in each round's order (``sigterm`` last: the final process is started with ``kill``)."""
WINDOW_TARGET_S = 2.0
KIND_TARGETS_S = {"sigkill": 2.0, UPGRADE: 1.0, "sigterm": 1.0}
"""Issue 37's targets for the window's p99: a SIGKILL restart 2 s, a SIGTERM restart and an upgrade 1 s."""
EXIT_TARGET_S = 10.0
TOP_KEYS = ("survival", "window", "stop", "drain", "targets", "chaos")
TARGET_KEYS = ("all_survive", "window_p99_le_2s", "sigterm_exit_le_10s", "window_p99_per_kind")


@dataclass(frozen=True)
class Sample:
    """One exec of ``true`` by one client: monotonic start and end, and whether it answered exit code 0."""

    start: float
    end: float
    ok: bool
    error: str = ""
    timing: str = ""
    """Its answer's ``Server-Timing`` (``control``, ``agent``, ``guest``), when it had one."""


def client_window(samples: Iterable[Sample], pivot: float) -> float | None:
    """Seconds from the client's last success completed at or before ``pivot`` (the old server's exit) to its first
    success completed after it; ``None`` when either side has no success."""
    before = [s.end for s in samples if s.ok and s.end <= pivot]
    after = [s.end for s in samples if s.ok and s.end > pivot]
    if not before or not after:
        return None
    return min(after) - max(before)


def first_success_after(samples: Iterable[Sample], pivot: float) -> float | None:
    after = [s.end for s in samples if s.ok and s.end > pivot]
    return min(after) if after else None


def first_timing_after(samples: Iterable[Sample], pivot: float) -> str | None:
    """The ``Server-Timing`` of the first success after ``pivot`` (where the first exec after a restart spent its
    time on the server's side; the rest of its wait was before the server read it)."""
    after = sorted((s for s in samples if s.ok and s.end > pivot), key=lambda s: s.end)
    return after[0].timing if after else None


def round_window(per_client: Sequence[Sequence[Sample]], pivot: float) -> float | None:
    """The worst client's window (``None`` when any client has none: it never recovered, or never succeeded)."""
    windows = [client_window(samples, pivot) for samples in per_client]
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)


def seconds_stats(samples: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p99/max (nearest rank, seconds, 3 decimals) and the sample count; ``None`` figures when empty."""
    if not samples:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {
        "n": len(samples),
        "p50": round(percentile(list(samples), 50), 3),
        "p99": round(percentile(list(samples), 99), 3),
        "max": round(max(samples), 3),
    }


def window_summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rounds ``{kind, window_s, startup_s, stop_s, ...}`` -> per kind: the window's p50/p99/max, the share that is
    process start-up (launch until ``/healthz`` answers), the remainder, and how many rounds never recovered."""
    out: dict[str, Any] = {"target_p99_s": WINDOW_TARGET_S}
    for kind in KINDS:
        mine = [r for r in rounds if r.get("kind") == kind]
        windows = [float(r["window_s"]) for r in mine if r.get("window_s") is not None]
        startups = [float(r["startup_s"]) for r in mine if r.get("startup_s") is not None]
        rest = [
            float(r["window_s"]) - float(r["startup_s"])
            for r in mine
            if r.get("window_s") is not None and r.get("startup_s") is not None
        ]
        stops = [float(r["stop_s"]) for r in mine if r.get("stop_s") is not None]
        out[kind] = {
            "rounds": len(mine),
            "unrecovered": len(mine) - len(windows),
            "window_s": seconds_stats(windows),
            "startup_s": seconds_stats(startups),
            "window_minus_startup_s": seconds_stats(rest),
            "signal_to_exit_s": seconds_stats(stops),
            "startup_marks_p50_s": _marks_p50([r.get("startup_marks_s") for r in mine]),
            "startup_share_p50": round(percentile(startups, 50) / percentile(windows, 50), 3)
            if windows and startups and percentile(windows, 50) > 0
            else None,
        }
    return out


def _marks_p50(marks: Sequence[Any]) -> dict[str, float]:
    """Per start-up step, the p50 of when it was logged (seconds since launch) over the rounds that logged it."""
    names = sorted({name for m in marks if isinstance(m, Mapping) for name in m})
    out = {}
    for name in names:
        values = [float(m[name]) for m in marks if isinstance(m, Mapping) and name in m]
        out[name] = round(percentile(values, 50), 3)
    return dict(sorted(out.items(), key=lambda item: item[1]))


def survival_summary(n: int, rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rounds ``{kind, running_before, running_after, survived}`` -> per kind: the worst restart's figures (fewest
    survivors), every restart's, and whether all ``n`` survived every restart of that kind."""
    out: dict[str, Any] = {"n": n}
    for kind in KINDS:
        mine = [r for r in rounds if r.get("kind") == kind]
        if not mine:
            out[kind] = {"restarts": 0, "running_before": None, "running_after": None, "survived": None}
            continue
        worst = min(mine, key=lambda r: int(r.get("survived", 0)))
        out[kind] = {
            "restarts": len(mine),
            "running_before": worst.get("running_before"),
            "running_after": worst.get("running_after"),
            "survived": worst.get("survived"),
            "all_restarts_survived": all(int(r.get("survived", 0)) == n for r in mine),
            "per_restart": [int(r.get("survived", 0)) for r in mine],
        }
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` -> {field: kB}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def memory_used(before_kb: int, after_kb: int, vms: int) -> dict[str, float | None]:
    """MemAvailable before and after starting ``vms`` VMs -> MiB used in all and per VM."""
    used = (before_kb - after_kb) / 1024
    return {
        "mem_available_before_mib": round(before_kb / 1024, 1),
        "mem_available_after_mib": round(after_kb / 1024, 1),
        "used_mib": round(used, 1),
        "used_per_vm_mib": round(used / vms, 1) if vms else None,
    }


def drain_summary(answer: Mapping[str, Any], wakes: Sequence[Mapping[str, Any]], source: str) -> dict[str, Any]:
    """The drain route's answer and each sandbox's first exec afterwards (``{id, seconds, ok, host, before}``)."""
    drained = answer.get("drained")
    entries = drained if isinstance(drained, list) else []
    per_sandbox = [float(d["seconds"]) for d in entries if isinstance(d, Mapping) and "seconds" in d]
    hosts = [str(w.get("host")) for w in wakes]
    wake_s = [float(w["seconds"]) for w in wakes if w.get("ok")]
    return {
        "source": source,
        "count": answer.get("count"),
        "drained": len(drained) if isinstance(drained, list) else drained,
        "drain_total_s": answer.get("seconds"),
        "drain_per_sandbox_s": seconds_stats(per_sandbox),
        "first_exec_s": seconds_stats(wake_s),
        "woke": len(wake_s),
        "processes_survived": sum(1 for w in wakes if w.get("process_alive")),
        "ended_on": {h: hosts.count(h) for h in sorted(set(hosts))},
        "left_source": sum(1 for h in hosts if h != source),
        "sandboxes": [dict(w) for w in wakes],
        "answer": dict(answer),
    }


def targets(survival: Mapping[str, Any], window: Mapping[str, Any], stop: Mapping[str, Any]) -> dict[str, Any]:
    """Pass/fail per target: every sandbox survives every restart, window p99 ≤ 2 s (each kind), SIGTERM exit with
    on-stop keep ≤ 10 s. A target whose phase failed or did not run fails (``value`` says why)."""
    n = survival.get("n")
    kinds = [survival.get(k) for k in KINDS]
    survive_ok = bool(n) and all(isinstance(k, Mapping) and k.get("all_restarts_survived") for k in kinds)
    p99s = {}
    for kind in KINDS:
        block = window.get(kind)
        p99s[kind] = block.get("window_s", {}).get("p99") if isinstance(block, Mapping) else None
        if isinstance(block, Mapping) and block.get("unrecovered"):
            p99s[kind] = None
    window_ok = all(v is not None and v <= WINDOW_TARGET_S for v in p99s.values())
    keep = stop.get("keep")
    keep = keep if isinstance(keep, Mapping) else {}
    exit_s = keep.get("signal_to_exit_s")
    exit_ok = exit_s is not None and not keep.get("forced") and float(exit_s) <= EXIT_TARGET_S
    return {
        "all_survive": {"pass": survive_ok, "value": {k: survival.get(k, {}).get("survived") for k in KINDS}},
        "window_p99_le_2s": {"pass": window_ok, "value": p99s, "target_s": WINDOW_TARGET_S},
        "sigterm_exit_le_10s": {"pass": exit_ok, "value": exit_s, "target_s": EXIT_TARGET_S},
        "window_p99_per_kind": {
            "pass": all((v := p99s[k]) is not None and v <= limit for k, limit in KIND_TARGETS_S.items()),
            "value": p99s,
            "target_s": dict(KIND_TARGETS_S),
        },
    }


def chaos_block(results_dir: Path) -> dict[str, Any]:
    """``rounds``/``failures`` of the newest ``chaos-*.json`` in ``results_dir`` (both ``None`` without one)."""
    found = sorted(results_dir.glob("chaos-*.json")) if results_dir.is_dir() else []
    for path in reversed(found):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return {"rounds": data.get("rounds"), "failures": data.get("failures"), "source": str(path)}
    return {"rounds": None, "failures": None}


def missing_keys(result: Mapping[str, Any]) -> list[str]:
    """Promised keys absent from ``result`` (empty when the shape is complete)."""
    missing = [k for k in TOP_KEYS if k not in result]
    missing += [f"targets.{k}" for k in TARGET_KEYS if k not in result.get("targets", {})]
    missing += [f"chaos.{k}" for k in ("rounds", "failures") if k not in result.get("chaos", {})]
    return missing
