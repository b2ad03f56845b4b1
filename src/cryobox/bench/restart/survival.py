"""Phases 1 and 2 of ``cryobox bench restart``, on one ``cryobox serve`` with ``CRYOBOX_ON_STOP=keep``.

``n`` sandboxes each start a detached background process; ``clients`` threads exec ``true`` in a tight loop, each
in its own sandbox. Then ``rounds`` × (SIGKILL, SIGTERM) restarts, alternating. Each restart records the signal
to exit time, the new process's start-up until ``/healthz`` answers, the worst client's exec unavailability window
(last success before the old process exited to the first success after), and, once every client got through
again, how many of the ``n`` are listed ``running`` and answer an exec showing their background process (same pid
and start time). The last restart's process runs with ``kill``; its SIGTERM (every VM killed) is timed too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from .analysis import (
    KINDS,
    UPGRADE,
    first_success_after,
    first_timing_after,
    round_window,
    survival_summary,
    window_summary,
)
from .api import Api, ExecLoop, wait_successes
from .host import (
    KEEP_ENV,
    STARTUP_MARKS,
    STOP_MARKS,
    BenchServe,
    LogWatch,
    guest_cpu_cores,
    import_seconds,
    reclaim_data_dir,
    signal_and_wait,
    timed_start,
)
from .standbys import follow_server, log_size, logged_steps, wait_registered
from .successor import Adopted, become_subreaper, wait_successor

SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM}
RECOVER_TIMEOUT_S = 120.0


def _survivors(serve: BenchServe, processes: dict[str, tuple[int, str]]) -> tuple[int, int]:
    """(listed running, running and showing the same background process)."""
    with Api(serve.url, serve.api_key) as api:
        statuses = api.statuses()
        running = [sid for sid in processes if statuses.get(sid) == "running"]
        alive = sum(1 for sid in running if api.background_alive(sid, processes[sid]))
    return len(running), alive


def restart_round(
    serve: BenchServe,
    kind: str,
    loops: list[ExecLoop],
    processes: dict[str, tuple[int, str]],
    next_on_stop: str = "keep",
    launched: list[subprocess.Popen[bytes]] | None = None,
) -> dict[str, Any]:
    """One restart by ``kind``; the new process runs with ``CRYOBOX_ON_STOP=next_on_stop`` (the last one with
    ``kill``, so that stopping it afterwards leaves nothing running). With ``launched`` the bench is a supervisor
    with a warm standby (:mod:`.standbys`): every process it started is kept there, and after a SIGKILL or SIGTERM
    the standby serves while the restart stands by (or, with another ``next_on_stop``, takes over at once)."""
    running_before, _ = _survivors(serve, processes)
    t_round = time.monotonic()
    if not wait_successes(loops, t_round, 2, RECOVER_TIMEOUT_S):
        raise RuntimeError(f"exec clients not answered before a {kind} restart")
    offset = log_size(serve.log_path)
    if kind == UPGRADE:
        stop, t_exit, t_launch, startup_s, marks = _upgrade(serve)
    elif launched is not None:
        stop, t_exit, t_launch, startup_s, marks = _supervised(serve, SIGNALS[kind], next_on_stop, launched)
    else:
        t_signal = time.monotonic()
        stop = signal_and_wait(serve, SIGNALS[kind], timeout_s=60)
        t_exit = t_signal + float(stop["signal_to_exit_s"])
        serve.extra_env["CRYOBOX_ON_STOP"] = next_on_stop
        t_launch = time.monotonic()
        startup_s, marks = timed_start(serve)
    if launched is not None:  # the next restart finds a standby, as a service's does
        wait_registered(serve.log_path, offset, RECOVER_TIMEOUT_S)
    t_ready = t_launch + startup_s
    recovered = wait_successes(loops, t_exit, 1, RECOVER_TIMEOUT_S)
    per_client = [loop.between(t_round, time.monotonic()) for loop in loops]
    window = round_window(per_client, t_exit)
    firsts = [first_success_after(samples, t_exit) for samples in per_client]
    failed = [s.error for samples in per_client for s in samples if not s.ok]
    running_after, survived = _survivors(serve, processes)
    return {
        "kind": kind,
        "stop_s": stop["signal_to_exit_s"],
        "exit_code": stop["exit_code"],
        "forced": stop["forced"],
        "exit_to_launch_s": round(t_launch - t_exit, 3),
        "startup_s": round(startup_s, 3),
        "startup_marks_s": marks,
        "stopped_mark_s": stop["marks_s"].get("stopped"),
        "stop_steps_s": logged_steps(serve.log_path, offset, "stop"),
        "start_steps_s": logged_steps(serve.log_path, offset, "start"),
        "host_start_steps_s": logged_steps(serve.log_path, offset, "host start"),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "window_s": round(window, 3) if window is not None else None,
        "recovered": recovered,
        "exec_after_healthz_s": round(max(f for f in firsts if f is not None) - t_ready, 3)
        if all(f is not None for f in firsts)
        else None,
        "first_exec_server_timing": [first_timing_after(samples, t_exit) for samples in per_client],
        "failed_attempts": len(failed),
        "failures_by_error": {e: failed.count(e) for e in sorted(set(failed))},
        "running_before": running_before,
        "running_after": running_after,
        "survived": survived,
    }


def _upgrade(serve: BenchServe) -> tuple[dict[str, Any], float, float, float, dict[str, float]]:
    """``SIGUSR2``: the running serve starts its successor and hands over (it keeps its on-stop mode, which the
    upgrade overrides with keep). Returns the stop block, the old process's exit, the launch (the signal: the
    successor starts then) and the seconds from it until the successor answers ``/healthz``."""
    proc = serve.proc
    if proc is None or proc.poll() is not None:
        raise RuntimeError("serve is not running")
    t_signal = time.monotonic()
    watch = LogWatch(serve.log_path, {**STARTUP_MARKS, **STOP_MARKS}, t_signal)
    watch.start()
    try:
        proc.send_signal(signal.SIGUSR2)
        code = proc.wait(timeout=180)
        t_exit = time.monotonic()
        serve.proc = Adopted(wait_successor(serve.data_dir, proc.pid, timeout_s=120))
        serve.wait_ready(120)
        ready = time.monotonic()
    finally:
        marks = watch.finish()
    stop = {"signal_to_exit_s": round(t_exit - t_signal, 3), "exit_code": code, "forced": False, "marks_s": marks}
    return stop, t_exit, t_signal, ready - t_signal, marks


def _supervised(
    serve: BenchServe, sig: int, next_on_stop: str, launched: list[subprocess.Popen[bytes]]
) -> tuple[dict[str, Any], float, float, float, dict[str, float]]:
    """SIGKILL or SIGTERM, then the supervisor's restart (``cryobox serve`` again, handed the socket): the start-up
    and its marks count from the exit, since the standby takes over then, before the restart's process exists."""
    proc = serve.proc
    if proc is None or proc.poll() is not None:
        raise RuntimeError("serve is not running")
    old = proc.pid
    t_signal = time.monotonic()
    stop = signal_and_wait(serve, sig, timeout_s=60)
    t_exit = t_signal + float(stop["signal_to_exit_s"])
    watch = LogWatch(serve.log_path, STARTUP_MARKS, t_exit)
    watch.start()
    try:
        asked = serve.extra_env.get("CRYOBOX_ON_STOP") != next_on_stop  # another configuration: it takes over
        serve.extra_env["CRYOBOX_ON_STOP"] = next_on_stop
        serve.launch()
        assert serve.proc is not None
        claimer = serve.proc
        launched.append(claimer)
        follow_server(serve, launched, old, claimer, asked=asked, timeout_s=RECOVER_TIMEOUT_S)
        serve.wait_ready(RECOVER_TIMEOUT_S)
        ready = time.monotonic()
    finally:
        marks = watch.finish()
    return stop, t_exit, t_exit, ready - t_exit, marks


def run_survival(
    root: Path,
    *,
    n: int,
    rounds: int,
    clients: int,
    template: str,
    cache_dir: Path | None,
    console: Console,
    memory_mib: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(survival, window, extra): phase 1, phase 2 and the final stop with ``kill``. ``memory_mib``: what the
    server offers placement (``--memory-mib``; 50 idle ``base`` sandboxes need more than this host's RAM)."""
    data_dir = root / "restart"
    args = ["--templates", template, "--net-pool", "2"]
    if memory_mib is not None:
        args += ["--memory-mib", str(memory_mib)]
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)  # the supervisor's, as systemd's .socket unit
    serve = BenchServe(
        data_dir, cache_dir=cache_dir, prespawn=1, extra_env=dict(KEEP_ENV), extra_args=args, listen_socket=listener
    )
    launched: list[subprocess.Popen[bytes]] = []
    loops: list[ExecLoop] = []
    extra: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    become_subreaper()  # an upgrade's successor is the old serve's child: re-parented here, reaped here
    try:
        extra["python_import_s"] = round(import_seconds(), 3)
        extra["first_startup_s"] = round(timed_start(serve, serve.start_timeout_s)[0], 3)
        assert serve.proc is not None
        launched.append(serve.proc)
        wait_registered(serve.log_path, 0, RECOVER_TIMEOUT_S)  # its standby, spawned once it served
        console.print(f"[bold]survival[/bold]: {n} sandboxes with a background process (serve pid {serve.pid})")
        processes: dict[str, tuple[int, str]] = {}
        with Api(serve.url, serve.api_key) as api:
            for _ in range(n):
                sandbox_id = str(api.create(template)["id"])
                processes[sandbox_id] = api.start_background(sandbox_id)
        ids = list(processes)
        extra["idle_guests_cpu_cores"] = guest_cpu_cores(data_dir)
        loops = [ExecLoop(serve.url, serve.api_key, ids[i % len(ids)]) for i in range(max(1, clients))]
        for loop in loops:
            loop.start()
        for index in range(rounds):
            for kind in KINDS:
                last = index == rounds - 1 and kind == KINDS[-1]
                sample = restart_round(serve, kind, loops, processes, "kill" if last else "keep", launched)
                samples.append({"round": index, **sample})
                console.print(
                    f"  {kind} #{index}: window {sample['window_s']} s (start-up {sample['startup_s']} s, "
                    f"stop {sample['stop_s']} s), survived {sample['survived']}/{n}"
                )
        for loop in loops:
            loop.halt()
        extra["exec_attempts"] = sum(len(loop.samples) for loop in loops)
        extra["final_stop"] = _final_stop(serve, processes)
    except BaseException:
        for loop in loops:
            loop.halt()
        serve.stop(signal.SIGKILL)
        raise
    finally:
        serve.cleanup()
        extra["reclaimed_pids"] = len(reclaim_data_dir(data_dir, cache_dir))
        listener.close()
    survival = survival_summary(n, samples)
    window = window_summary(samples)
    window["clients"] = len(loops)
    window["rounds"] = samples
    return survival, window, extra


def _final_stop(serve: BenchServe, processes: dict[str, tuple[int, str]]) -> dict[str, Any]:
    """Stop the last restart's process (it runs with ``CRYOBOX_ON_STOP=kill``): nothing of the data dir runs after."""
    running, survived = _survivors(serve, processes)
    stop = signal_and_wait(serve, signal.SIGTERM, timeout_s=300)
    return {"vms": running, "survived_before": survived, "kill": stop}
