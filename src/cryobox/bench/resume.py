"""``cryobox bench resume``: how long a paused (hibernated) sandbox takes to answer its first command, side by side.

Against a real ``cryobox serve`` (pre-spawn 0, the ``base`` template), ``n`` rounds, each measuring, client wall
time from the call to the answer:

1. ``resume_then_command_ms``: a sandbox hibernated with ``auto_wake: false`` (what E2B's ``lifecycle={"on_timeout":
   "pause"}`` makes): an explicit resume (``wake``, the path of E2B's ``connect``) and its first command;
2. ``auto_wake_command_ms``: a hibernated sandbox with ``auto_wake`` (E2B's ``auto_resume``): one plain command,
   which wakes it;
3. ``running_command_ms``: the same command in a running sandbox (the floor both are compared to).

Each round hibernates both sandboxes first (not timed). The command reads a file written before the first
hibernation and checks a background process started then is still alive, so every figure is of a sandbox whose
memory and processes came back. Everything created is deleted in ``finally``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from ..sdk import Sandbox
from ..util.progress import Reporter
from .report import write_result
from .server import ServeProcess
from .snapshot import qemu_version
from .snapshot_report import BenchError
from .stats import stats, timed

TEMPLATE = "base"
SETUP = "echo kept > /tmp/kept; (sleep 100000 &); pgrep -n sleep > /tmp/pid"
CHECK = "cat /tmp/kept; kill -0 $(cat /tmp/pid) && echo alive"
NOTES = {
    "resume_then_command_ms": "explicit resume (wake: E2B connect's path) + first command, auto_wake off",
    "auto_wake_command_ms": "one command to a hibernated auto_wake sandbox (E2B auto_resume), which wakes it",
    "running_command_ms": "the same command in a running sandbox",
}


def _checked(sbx: Sandbox) -> None:
    result = sbx.exec(CHECK, timeout_seconds=60)
    if result.stdout != "kept\nalive\n":
        raise BenchError(f"the sandbox came back without its memory: {result.stdout!r} {result.stderr!r}")


def _resume_and_check(sbx: Sandbox) -> None:
    sbx.wake()
    _checked(sbx)


def measure(url: str, key: str, n: int, console: Console, progress: Reporter) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"resume": [], "auto": [], "running": []}
    explicit = Sandbox.create(TEMPLATE, on_timeout="hibernate", auto_wake=False, api_url=url, api_key=key)
    auto = Sandbox.create(TEMPLATE, on_timeout="hibernate", auto_wake=True, api_url=url, api_key=key)
    try:
        for sbx in (explicit, auto):
            sbx.exec(SETUP, timeout_seconds=60)
        with progress.phase("resume rounds", n) as rounds:
            for round_ in range(n):
                explicit.hibernate()
                auto.hibernate()
                samples["resume"].append(timed(lambda: _resume_and_check(explicit))[0])
                samples["auto"].append(timed(lambda: _checked(auto))[0])
                samples["running"].append(timed(lambda: _checked(auto))[0])
                console.print(
                    f"round {round_ + 1}/{n}: resume + command {samples['resume'][-1]:.0f} ms, auto-wake command "
                    f"{samples['auto'][-1]:.0f} ms, running {samples['running'][-1]:.0f} ms"
                )
                rounds.advance()
    finally:
        for sbx in (explicit, auto):
            sbx.kill()
    return samples


def build_result(samples: dict[str, list[float]], *, n: int, qemu: str) -> dict[str, Any]:
    resume, auto, running = (stats(samples[k]) for k in ("resume", "auto", "running"))
    return {
        "bench": "resume",
        "template": TEMPLATE,
        "n": n,
        "cores": os.cpu_count() or 0,
        "qemu": qemu,
        "resume_then_command_ms": resume,
        "auto_wake_command_ms": auto,
        "running_command_ms": running,
        "resume_over_running_p50": round(resume["p50"] / max(running["p50"], 0.1), 1),
        "notes": NOTES,
    }


def run_resume_bench(
    *, n: int, out_dir: Path, cache_dir: Path | None, console: Console, progress: Reporter
) -> dict[str, Any]:
    if n < 1:
        raise BenchError("--n must be at least 1")
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-resume-") as tmp:
        console.print("starting cryobox serve (prespawn 0, template base)")
        args = ["--templates", TEMPLATE]
        with ServeProcess(Path(tmp) / "data", cache_dir=cache_dir, prespawn=0, extra_args=args) as server:
            samples = measure(server.url, server.api_key, n, console, progress)
    result = build_result(samples, n=n, qemu=qemu_version())
    result["path"] = str(write_result(out_dir, "resume", result))
    return result
