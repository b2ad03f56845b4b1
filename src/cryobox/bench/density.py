"""``cryobox bench density``: the table peers publish, against one real ``cryobox serve`` (``--templates base``,
the default warm pool of 2), in one run:

1. Creates at concurrency 1/4/8/16: ``c`` clients each loop create -> ``exec true`` -> delete, back to back (no
   think time: the warm pool refills while they keep coming, as under sustained load), until the level has its
   samples; a sample is the time from the create request to the exec's answer.
2. Snapshot cost: a ``base`` sandbox writes X MiB of fresh random data to its tmpfs, then is snapshotted (the API
   call's wall time, as ``bench snapshot``'s dirty sweep); the slope over the sizes, in ms per 100 MiB.
3. Idle sandboxes, one after another, until admission refuses (503 ``capacity`` or 429) or ``--cap``; at
   N = 10/25/50 (those reached) and at the last one held, their Pss (:data:`.density_result.PSS_BASIS`). The
   count, the refusal and the host's free memory then; everything is deleted afterwards.

The workspace quotas of the server are raised above ``--cap`` (``CRYOBOX_QUOTA_*``), so what refuses is the
host's admission (placement: declared memory against the host's, minus the warm pool), not a tenant's quota.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ..agent.host.reclaim import find_own_qemus
from ..config import DEFAULT_CACHE_DIR, Paths
from ..util.progress import Reporter
from .density_result import (
    PSS_BASIS,
    is_refusal,
    latency_summary,
    machine,
    pss_level,
    refusal,
    sandbox_pids,
    snapshot_summary,
    table,
)
from .density_svg import render
from .pss import parse_rollup
from .report import write_result
from .server import ServeProcess
from .snapshot import hot_dir_bytes, qemu_version
from .snapshot_api import Api, api_session
from .snapshot_report import BenchError
from .snapshot_sweep import sweep_cmd
from .stats import percentile

TEMPLATE = "base"
TTL_S = 1800  # a safety net: the server is stopped with --on-stop kill anyway
SETTLE_S = 5.0  # before reading memory: guests go idle, the warm pool refills
LEVEL_PAUSE_S = 3.0  # between concurrency levels: the warm pool refills


def _meminfo_kib() -> dict[str, int]:
    return parse_rollup(Path("/proc/meminfo").read_text())


async def _level(url: str, api_key: str, concurrency: int, samples: int) -> tuple[list[float], list[float], list[str]]:
    """``concurrency`` clients looping create -> exec true -> delete, back to back, until ``samples`` were started;
    returns the latencies (ms), the server's ``boot_ms`` of each create and the failures."""
    latencies: list[float] = []
    boots: list[float] = []
    errors: list[str] = []
    remaining = [samples]
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=concurrency * 2 + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:

        async def one() -> None:
            t0 = time.monotonic()
            created = await client.post("/v1/sandboxes", json={"template": TEMPLATE, "ttl_seconds": TTL_S})
            if created.status_code != 201:
                errors.append(f"create: HTTP {created.status_code} {created.text[:200]}")
                return
            sandbox_id = str(created.json()["id"])
            boots.append(float(created.json().get("boot_ms") or 0.0))
            try:
                answer = await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "true"})
                if answer.status_code == 200 and answer.json().get("exit_code") == 0:
                    latencies.append((time.monotonic() - t0) * 1000)
                else:
                    errors.append(f"exec: HTTP {answer.status_code} {answer.text[:200]}")
            finally:
                await client.delete(f"/v1/sandboxes/{sandbox_id}")

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                try:
                    await one()
                except httpx.HTTPError as err:
                    errors.append(repr(err))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, boots, errors


def measure_creates(
    serve: ServeProcess, levels: Sequence[int], samples: int, console: Console, progress: Reporter
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with progress.phase("creates per concurrency level", len(levels)) as phase:
        for c in levels:
            time.sleep(LEVEL_PAUSE_S)
            latencies, boots, errors = asyncio.run(_level(serve.url, serve.api_key, c, samples))
            out[str(c)] = {
                **latency_summary(latencies, len(errors)),
                "server_boot_ms_p50": round(percentile(boots, 50), 1) if boots else None,
                "samples_ms": [round(x, 1) for x in latencies],
                "first_errors": errors[:3],
            }
            s = out[str(c)]
            console.print(f"  concurrency {c}: avg {s['avg']} p50 {s['p50']} p95 {s['p95']} p99 {s['p99']} ms")
            phase.advance()
    return out


def measure_snapshots(api: Api, sizes: Sequence[int], reps: int, console: Console) -> dict[str, Any]:
    """Per size, ``reps`` sandboxes dirty that many MiB and are snapshotted once (the call's wall time)."""
    samples: dict[int, list[float]] = {}
    for mib in sizes:
        for _ in range(reps):
            sbx = api.create({"template": TEMPLATE, "ttl_seconds": TTL_S})
            api.exec(sbx["id"], sweep_cmd(mib))
            started = time.monotonic()
            snap = api.snapshot(sbx["id"])
            samples.setdefault(mib, []).append(round((time.monotonic() - started) * 1000, 1))
            api.delete_snapshot(snap["id"])
            api.delete_sandbox(sbx["id"])
        console.print(f"  dirtied {mib} MiB: snapshot {samples[mib]} ms")
    return snapshot_summary(samples)


def _memserver_pid(paths: Paths) -> int | None:
    try:
        pid = int((paths.memserver_dir / "memserver.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _pss_now(api: Api, paths: Paths, before_kib: int) -> dict[str, Any]:
    time.sleep(SETTLE_S)
    pids = sandbox_pids(paths.records_dir, api.sandboxes)
    strangers = set(pids.values()) - set(find_own_qemus(paths.run_dir))
    if strangers:
        raise BenchError(f"records name pids that are no QEMU of this server: {sorted(strangers)}")
    return pss_level(
        len(api.sandboxes),
        list(pids.values()),
        memserver_pid=_memserver_pid(paths),
        mem_available_before_kib=before_kib,
        mem_available_kib=_meminfo_kib()["MemAvailable"],
    )


def fill(
    api: Api, paths: Paths, cap: int, pss_at: Sequence[int], console: Console, progress: Reporter
) -> dict[str, Any]:
    """Idle sandboxes until admission refuses or ``cap``; Pss at the levels of ``pss_at`` reached and at the end."""
    time.sleep(SETTLE_S)
    before = _meminfo_kib()["MemAvailable"]
    levels: list[dict[str, Any]] = []
    refused: dict[str, Any] | None = None
    failure: str | None = None
    with progress.phase("idle sandboxes until refused", cap) as phase:
        while len(api.sandboxes) < cap:
            try:
                resp = api.http.post("/v1/sandboxes", json={"template": TEMPLATE, "ttl_seconds": TTL_S})
            except httpx.HTTPError as err:
                failure = repr(err)
                break
            if resp.status_code == 201:
                api.sandboxes.append(str(resp.json()["id"]))
                phase.advance()
                if len(api.sandboxes) in pss_at:
                    levels.append(_pss_now(api, paths, before))
                    console.print(f"  N={len(api.sandboxes)}: {levels[-1]['pss_per_sandbox_mib']} MiB Pss each")
                continue
            if is_refusal(resp.status_code):
                refused = refusal(resp.status_code, resp.text)
            else:
                failure = f"HTTP {resp.status_code}: {resp.text[:300]}"
            break
    mem = _meminfo_kib()
    held = len(api.sandboxes)
    if held and (not levels or levels[-1]["n"] != held):
        levels.append(_pss_now(api, paths, before))
    console.print(f"  held {held} idle sandboxes; refusal {refused}; other failure {failure}")
    return {
        "levels": levels,
        "not_reached": [n for n in pss_at if n > held],
        "capacity": {
            "held": held,
            "cap": cap,
            "refusal": refused,
            "stopped_by_error": failure,
            "mem_free_mib": round(mem.get("MemFree", 0) / 1024, 1),
            "mem_available_mib": round(mem.get("MemAvailable", 0) / 1024, 1),
            "mem_available_before_mib": round(before / 1024, 1),
            "hot_copy_mib": round(hot_dir_bytes(paths.hot_dir) / 2**20, 1),
        },
    }


def _serve(data_dir: Path, cache_dir: Path | None, cap: int, memory_mib: int | None) -> ServeProcess:
    env = {
        "CRYOBOX_QUOTA_SANDBOXES": str(cap + 16),
        "CRYOBOX_QUOTA_VCPUS": str((cap + 16) * 16),
        "CRYOBOX_QUOTA_MEMORY_MIB": str((cap + 16) * 65536),
    }
    args = ["--templates", TEMPLATE]
    if memory_mib is not None:
        args += ["--memory-mib", str(memory_mib)]
    return ServeProcess(data_dir, cache_dir=cache_dir, extra_env=env, extra_args=args)


def run_density_bench(
    *,
    samples: int,
    levels: Sequence[int],
    pss_at: Sequence[int],
    cap: int,
    snapshot_mib: Sequence[int],
    snapshot_reps: int,
    memory_mib: int | None,
    plot: bool,
    out_dir: Path,
    cache_dir: Path | None,
    console: Console,
    progress: Reporter,
) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-density-", dir="/var/tmp") as tmp:
        data_dir = Path(tmp) / "data"
        with _serve(data_dir, cache_dir, cap, memory_mib) as serve:
            paths = Paths(data_dir.resolve(), (cache_dir or DEFAULT_CACHE_DIR).resolve())
            with api_session(serve.url, serve.api_key, console) as api:
                info = api.call("GET", "/v1/info", 200)
                console.print(f"[bold]creates[/bold] at concurrency {list(levels)}, {samples} samples each")
                creates = measure_creates(serve, levels, samples, console, progress)
                console.print(f"[bold]snapshots[/bold] after dirtying {list(snapshot_mib)} MiB, {snapshot_reps} each")
                snapshot = measure_snapshots(api, snapshot_mib, snapshot_reps, console)
                console.print(f"[bold]idle sandboxes[/bold] until admission refuses (cap {cap})")
                filled = fill(api, paths, cap, pss_at, console, progress)
    result: dict[str, Any] = {
        "template": TEMPLATE,
        "machine": machine(
            cpuinfo=Path("/proc/cpuinfo").read_text(),
            meminfo=Path("/proc/meminfo").read_text(),
            cores=os.cpu_count() or 0,
            accelerator=str(info["accelerator"]),
            qemu=qemu_version(),
            server_version=str(info["version"]),
        ),
        "config": {
            "samples_per_level": samples,
            "levels": list(levels),
            "pss_at": list(pss_at),
            "cap": cap,
            "snapshot_mib": list(snapshot_mib),
            "snapshot_reps": snapshot_reps,
            "memory_mib_offered": memory_mib,
            "prespawn": 2,
            "pool_mode": "warm",
        },
        "create_to_first_exec_ms": creates,
        "pss": {"basis": PSS_BASIS, "levels": filled["levels"], "not_reached": filled["not_reached"]},
        "capacity": filled["capacity"],
        "snapshot": snapshot,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.monotonic() - started, 1),
    }
    out = write_result(out_dir, "density", result)
    console.print(table(result))
    console.print(f"written to {out}")
    if plot:
        svg = out.with_suffix(".svg")
        svg.write_text(render(result))
        console.print(f"plot {svg}")
    return result
