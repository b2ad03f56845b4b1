"""``cryobox bench restart``: run the phases, assemble the result, print it, write ``restart-<stamp>.json``.

A phase that fails is recorded as ``{"error": ...}`` (its logs copied to a directory that stays) and the next one
still runs; the result's ``errors`` lists them, and its ``targets`` fail for what could not be measured.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from ...util.progress import Reporter
from ..fleet import keep_logs
from ..report import write_result
from .analysis import KINDS, chaos_block, targets
from .drain import run_drain
from .many import run_many
from .survival import run_survival

T = TypeVar("T")


def _phase(name: str, errors: list[str], console: Console, progress: Reporter, fn: Callable[[], T], failed: T) -> T:
    try:
        with progress.phase(name):
            return fn()
    except Exception as err:
        console.print(f"[red]{name} failed[/red]: {err!r}")
        console.print(traceback.format_exc(limit=6))
        errors.append(f"{name}: {err!r}"[:500])
        return failed


def run_restart_bench(
    *,
    n: int = 8,
    rounds: int = 5,
    clients: int = 2,
    vms: int = 50,
    memory_mib: int | None = 65536,
    drain: bool = True,
    drain_n: int = 6,
    template: str = "base",
    out_dir: Path,
    cache_dir: Path | None,
    console: Console,
    progress: Reporter,
) -> dict[str, Any]:
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="cryobox-restart-", dir="/var/tmp"))
    errors: list[str] = []
    survival: dict[str, Any]
    window: dict[str, Any]
    extra: dict[str, Any]
    try:

        def phases_1_2() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
            return run_survival(
                root,
                n=n,
                rounds=rounds,
                clients=clients,
                template=template,
                cache_dir=cache_dir,
                console=console,
                memory_mib=memory_mib,
            )

        failed: dict[str, Any] = {"error": "see errors"}
        nothing: dict[str, Any] = {}
        survival, window, extra = _phase(
            "survival/window", errors, console, progress, phases_1_2, (failed, failed, nothing)
        )
        stop = _phase(
            "stop",
            errors,
            console,
            progress,
            lambda: run_many(
                root, vms=vms, memory_mib=memory_mib, template=template, cache_dir=cache_dir, console=console
            ),
            failed,
        )
        drained: dict[str, Any] = {"skipped": True}
        if drain:
            drained = _phase(
                "drain",
                errors,
                console,
                progress,
                lambda: run_drain(root, n=drain_n, template=template, cache_dir=cache_dir, console=console),
                failed,
            )
        if errors:
            console.print(f"logs kept in {keep_logs(root)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "survival": survival,
        "window": window,
        "stop": stop,
        "drain": drained,
        "targets": targets(survival, window, stop),
        "chaos": chaos_block(out_dir),
        "serve": extra,
        "errors": errors,
        "config": {
            "n": n,
            "rounds": rounds,
            "clients": clients,
            "vms": vms,
            "memory_mib": memory_mib,
            "drain": drain,
            "drain_n": drain_n,
            "template": template,
            "cpus": os.cpu_count(),
        },
        "duration_s": round(time.monotonic() - started, 1),
    }
    path = write_result(out_dir, "restart", result)
    print_result(result, console)
    console.print(f"wrote {path}")
    return result


def _get(block: Mapping[str, Any], *keys: str) -> Any:
    value: Any = block
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def print_result(result: Mapping[str, Any], console: Console) -> None:
    table = Table(title=f"restarts ({_get(result, 'config', 'rounds')} per kind, n={_get(result, 'survival', 'n')})")
    for column in ("", "survived", "window p50", "p99", "max", "start-up p50", "window − start-up p50", "stop p50"):
        table.add_column(column, justify="right")
    for kind in KINDS:
        w = _get(result, "window", kind) or {}
        s = _get(result, "survival", kind) or {}
        table.add_row(
            kind,
            f"{s.get('survived')}/{_get(result, 'survival', 'n')} ({s.get('per_restart')})",
            *(str(_get(w, "window_s", q)) for q in ("p50", "p99", "max")),
            str(_get(w, "startup_s", "p50")),
            str(_get(w, "window_minus_startup_s", "p50")),
            str(_get(w, "signal_to_exit_s", "p50")),
        )
    console.print(table)
    stop = result.get("stop", {})
    for mode in ("keep", "kill"):
        console.print(
            f"{_get(stop, mode, 'vms')} VMs, SIGTERM with {mode}: exit {_get(stop, mode, 'signal_to_exit_s')} s "
            f"(logged stopped at {_get(stop, mode, 'until_stopped_line_s')} s, then "
            f"{_get(stop, mode, 'after_stopped_line_s')} s of interpreter teardown)"
        )
    console.print(
        f"memory {stop.get('memory')}; idle guests use {stop.get('idle_guests_cpu_cores')} cores with the agent up, "
        f"{stop.get('idle_guests_cpu_cores_agent_down')} with it gone; the restart that adopts them took "
        f"{stop.get('adopt_startup_s')} s to /healthz"
    )
    drain = result.get("drain", {})
    if "error" in drain or "skipped" in drain:
        console.print(f"drain: {drain}")
    else:
        console.print(
            f"drain: {drain.get('drained')} in {drain.get('drain_total_s')} s (per sandbox "
            f"{drain.get('drain_per_sandbox_s')}), first exec {drain.get('first_exec_s')}, "
            f"ended on {drain.get('ended_on')}"
        )
    for name, target in result.get("targets", {}).items():
        mark = "[green]pass[/green]" if target.get("pass") else "[red]fail[/red]"
        console.print(f"{name}: {mark} ({target.get('value')})")
