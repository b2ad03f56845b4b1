"""The pure half of ``cryobox bench density``: latency summaries, the snapshot slope, the machine's description
from ``/proc`` text, the Pss of a level of idle sandboxes from their records, the result's shape and its table.

Nothing here starts a process or a VM; the runner (:mod:`.density`) feeds it what it measured.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from .pss import parse_rollup, rollup_kib
from .stats import percentile

PSS_BASIS = (
    "pss_per_sandbox_mib: the Pss line of /proc/<pid>/smaps_rollup summed over the N sandboxes' QEMU processes "
    "(pids from the agent's records, <data>/vol/sandboxes/<id>.json), whole processes: guest RAM they touched "
    "(shared pages of the template's hot copy split among its mappers), QEMU itself and its TCG translation "
    "buffer; plus the Pss of the host's memory server process divided by N (it runs with hot memory too; with "
    "--memory lazy the sandboxes' RAM pages come from it). Not counted: warm-pool QEMUs, the server's Python "
    "process, kernel memory (page tables, netns). "
    "host_used_per_sandbox_mib: the fall of MemAvailable since before the first idle sandbox, divided by N "
    "(everything, kernel included). hot_copy_mib: the template's memory image on tmpfs, a fixed cost the "
    "sandboxes share (the part of it they mapped is inside their Pss)."
)


def latency_summary(samples_ms: Sequence[float], errors: int = 0) -> dict[str, Any]:
    """avg/p50/p95/p99/max (nearest rank) of the successful samples, with their count and the failures'."""
    if not samples_ms:
        return {"n": 0, "errors": errors, "avg": None, "p50": None, "p95": None, "p99": None, "max": None}
    values = list(samples_ms)
    return {
        "n": len(values),
        "errors": errors,
        "avg": round(sum(values) / len(values), 1),
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values), 1),
    }


def slope(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line through ``(x, y)`` points: ``(slope, intercept)``.

    :raises ValueError: fewer than two distinct x values.
    """
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise ValueError("a slope needs at least two distinct x values")
    mean_x = sum(xs) / len(xs)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    k = sxy / sxx
    return k, mean_y - k * mean_x


def snapshot_summary(samples: Mapping[int, Sequence[float]]) -> dict[str, Any]:
    """Snapshot call times per MiB dirtied -> each size's p50 and the least-squares slope through those p50s, in ms
    per 100 MiB (a server's first snapshot pays one-time costs: fitted through every sample, one such outlier at
    the smallest size would flatten the slope)."""
    p50s = {mib: round(percentile(list(values), 50), 1) for mib, values in samples.items() if values}
    per_size = [
        {"dirtied_mib": mib, "snapshot_ms_p50": p50s[mib], "samples_ms": list(samples[mib])} for mib in sorted(p50s)
    ]
    try:
        k, intercept = slope([(float(mib), ms) for mib, ms in p50s.items()])
    except ValueError:
        return {"points": per_size, "ms_per_100_mib": None, "intercept_ms": None}
    return {"points": per_size, "ms_per_100_mib": round(k * 100, 1), "intercept_ms": round(intercept, 1)}


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` (``unknown`` without one)."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "model name":
            return value.strip()
    return "unknown"


def machine(
    *, cpuinfo: str, meminfo: str, cores: int, accelerator: str, qemu: str, server_version: str, kernel: str = ""
) -> dict[str, Any]:
    """What the result is true of: cores, memory, CPU model, kernel, QEMU, accelerator."""
    mem = parse_rollup(meminfo)
    return {
        "accelerator": accelerator,
        "cores": cores,
        "memory_mib": mem.get("MemTotal", 0) // 1024,
        "cpu_model": cpu_model(cpuinfo),
        "kernel": kernel or platform.release(),
        "qemu": qemu,
        "server_version": server_version,
    }


def sandbox_pids(records_dir: Path, sandbox_ids: Sequence[str]) -> dict[str, int]:
    """Each sandbox's QEMU pid from its agent record (``vm.pid``); sandboxes without a readable one are left out."""
    pids: dict[str, int] = {}
    for sandbox_id in sandbox_ids:
        try:
            record = json.loads((records_dir / f"{sandbox_id}.json").read_text())
            pids[sandbox_id] = int(record["vm"]["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return pids


def pss_level(
    n: int,
    qemu_pids: Sequence[int],
    *,
    memserver_pid: int | None,
    mem_available_before_kib: int,
    mem_available_kib: int,
    proc: Path = Path("/proc"),
) -> dict[str, Any]:
    """The memory of ``n`` idle sandboxes whose QEMUs are ``qemu_pids`` (see :data:`PSS_BASIS`).

    :raises RuntimeError: a QEMU is gone or not every sandbox's QEMU was found.
    """
    if len(qemu_pids) != n:
        raise RuntimeError(f"found {len(qemu_pids)} QEMU pids for {n} sandboxes")
    qemu_pss = sum(rollup_kib(pid, "Pss", proc) for pid in qemu_pids) / 1024
    qemu_rss = sum(rollup_kib(pid, "Rss", proc) for pid in qemu_pids) / 1024
    memserver = rollup_kib(memserver_pid, "Pss", proc) / 1024 if memserver_pid is not None else 0.0
    return {
        "n": n,
        "pss_per_sandbox_mib": round((qemu_pss + memserver) / n, 1),
        "qemu_pss_total_mib": round(qemu_pss, 1),
        "qemu_rss_per_sandbox_mib": round(qemu_rss / n, 1),
        "memserver_pss_mib": round(memserver, 1) if memserver_pid is not None else None,
        "host_used_per_sandbox_mib": round((mem_available_before_kib - mem_available_kib) / 1024 / n, 1),
        "mem_available_mib": round(mem_available_kib / 1024, 1),
    }


def refusal(status: int, body: str) -> dict[str, Any]:
    """A refused create: its HTTP status and the error's wire ``code`` (``None`` if the body has none)."""
    code: str | None = None
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("code") is not None:
        code = str(parsed["code"])  # the error body: {"error": message, "code": wire code, "details": {...}}
    return {"status": status, "code": code, "message": body[:300]}


def is_refusal(status: int) -> bool:
    """Admission said no: 503 (``capacity``) or 429 (a quota or the request rate)."""
    return status in (429, 503)


def table(result: Mapping[str, Any]) -> Table:
    """The figures peers publish, one row each, with the machine in the title."""
    m = result["machine"]
    out = Table(
        title=f"density ({result['template']}, {m['accelerator'].upper()}, {m['cores']} cores, "
        f"{m['memory_mib'] / 1024:.0f} GiB, {m['cpu_model']})"
    )
    out.add_column("measure")
    out.add_column("value", justify="right")
    for level, s in result["create_to_first_exec_ms"].items():
        out.add_row(
            f"create → first exec, concurrency {level} (n={s['n']}, errors {s['errors']})",
            f"avg {s['avg']} / p50 {s['p50']} / p95 {s['p95']} / p99 {s['p99']} ms",
        )
    for level in result["pss"]["levels"]:
        out.add_row(
            f"Pss per idle sandbox, N={level['n']}",
            f"{level['pss_per_sandbox_mib']} MiB (host: {level['host_used_per_sandbox_mib']} MiB)",
        )
    cap = result["capacity"]
    refused = cap["refusal"]
    why = f"{refused['status']} {refused['code']}" if refused else f"cap {cap['cap']} reached, no refusal"
    out.add_row("idle sandboxes held before admission refused", f"{cap['held']} ({why})")
    out.add_row("host memory free / available then", f"{cap['mem_free_mib']} / {cap['mem_available_mib']} MiB")
    snap = result["snapshot"]
    out.add_row("snapshot per 100 MiB dirtied (slope)", f"{snap['ms_per_100_mib']} ms (+{snap['intercept_ms']} ms)")
    return out
