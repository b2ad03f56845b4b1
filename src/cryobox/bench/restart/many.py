"""Phase 3 of ``cryobox bench restart``: SIGTERM-to-exit with many VMs.

A ``cryobox serve`` offering ``memory_mib`` to placement (``--memory-mib``: 50 × 512 MiB is more than this host's
MemTotal, but every guest maps one shared template image copy-on-write, so real use per VM is small) runs ``vms``
sandboxes; host MemAvailable is read before the creates and after. SIGTERM with ``keep`` is timed to exit (target
≤ 10 s); the next start adopts the VMs (its start-up and the count are recorded); then SIGTERM with ``kill`` is
timed (reported, no target) and MemAvailable read again.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ...errors import CryoboxError
from .analysis import EXIT_TARGET_S, memory_used, seconds_stats
from .api import Api
from .host import (
    KEEP_ENV,
    BenchServe,
    guest_cpu_cores,
    mem_available_kb,
    reclaim_data_dir,
    signal_and_wait,
    timed_start,
)

CREATE_WORKERS = 4
SETTLE_S = 3.0


def _create_all(serve: BenchServe, template: str, vms: int) -> tuple[list[str], list[float], list[str]]:
    """``vms`` creates, ``CREATE_WORKERS`` at a time: (ids, latencies in s, error texts)."""

    def one(api: Api) -> tuple[str, float] | str:
        t0 = time.monotonic()
        try:
            return str(api.create(template)["id"]), time.monotonic() - t0
        except (CryoboxError, httpx.HTTPError) as err:
            return str(err)[:300]

    with Api(serve.url, serve.api_key, timeout_s=900) as api, ThreadPoolExecutor(CREATE_WORKERS) as pool:
        results = list(pool.map(lambda _: one(api), range(vms)))
    done = [r for r in results if isinstance(r, tuple)]
    return [r[0] for r in done], [r[1] for r in done], [r for r in results if isinstance(r, str)]


def _split(stop: dict[str, Any]) -> dict[str, float | None]:
    """A stop's two parts: until serve logged that it stopped, and from there until the process was gone (the
    interpreter's own teardown)."""
    stopped = stop.get("marks_s", {}).get("stopped")
    total = float(stop["signal_to_exit_s"])
    return {
        "until_stopped_line_s": stopped,
        "after_stopped_line_s": round(total - stopped, 3) if stopped is not None else None,
    }


def _running(serve: BenchServe) -> int:
    with Api(serve.url, serve.api_key) as api:
        return sum(1 for status in api.statuses().values() if status == "running")


def run_many(
    root: Path, *, vms: int, memory_mib: int | None, template: str, cache_dir: Path | None, console: Console
) -> dict[str, Any]:
    data_dir = root / "many"
    args = ["--templates", template, "--net-pool", "4", "--max-sandboxes", str(vms + 8)]
    args += ["--admission-timeout", "600"]
    if memory_mib is not None:
        args += ["--memory-mib", str(memory_mib)]
    serve = BenchServe(data_dir, cache_dir=cache_dir, prespawn=1, extra_env=KEEP_ENV, extra_args=args)
    out: dict[str, Any] = {"vms": vms, "memory_mib_offered": memory_mib}
    try:
        out["startup_s"] = round(timed_start(serve, serve.start_timeout_s)[0], 3)
        console.print(f"[bold]stop[/bold]: {vms} sandboxes on one serve (pid {serve.pid}), then SIGTERM")
        before_kb = mem_available_kb()
        t0 = time.monotonic()
        ids, latencies, errors = _create_all(serve, template, vms)
        out["create_wall_s"] = round(time.monotonic() - t0, 1)
        out.update(created=len(ids), create_errors=len(errors), first_create_errors=errors[:3])
        out["capacity_refused"] = sum(1 for e in errors if "capacity" in e)
        out["create_s"] = seconds_stats(latencies)
        time.sleep(SETTLE_S)  # let the last guests settle before reading memory
        out["memory"] = memory_used(before_kb, mem_available_kb(), len(ids))
        out["running_before_stop"] = _running(serve)
        out["idle_guests_cpu_cores"] = guest_cpu_cores(data_dir)
        console.print(f"  {len(ids)} created in {out['create_wall_s']} s; memory {out['memory']}")
        keep = signal_and_wait(serve, signal.SIGTERM, timeout_s=120)
        out["keep"] = {**keep, **_split(keep), "target_s": EXIT_TARGET_S, "vms": out["running_before_stop"]}
        out["mem_available_after_keep_stop_mib"] = round(mem_available_kb() / 1024, 1)
        out["idle_guests_cpu_cores_agent_down"] = guest_cpu_cores(data_dir)  # the kept VMs, nobody serving them
        console.print(f"  SIGTERM (keep): exited in {keep['signal_to_exit_s']} s (code {keep['exit_code']})")
        serve.extra_env["CRYOBOX_ON_STOP"] = "kill"
        adopt_s, marks = timed_start(serve)
        out.update(adopt_startup_s=round(adopt_s, 3), adopt_startup_marks_s=marks)
        out["adopted_running"] = _running(serve)
        kill = signal_and_wait(serve, signal.SIGTERM, timeout_s=300)
        out["kill"] = {**kill, **_split(kill), "vms": out["adopted_running"]}
        console.print(
            f"  restart adopted {out['adopted_running']}; SIGTERM (kill) exited in {kill['signal_to_exit_s']} s"
        )
    except BaseException:
        serve.stop(signal.SIGKILL)
        raise
    finally:
        serve.cleanup()
        out["reclaimed_pids"] = len(reclaim_data_dir(data_dir, cache_dir))
        out["mem_available_after_kill_mib"] = round(mem_available_kb() / 1024, 1)
    return out
