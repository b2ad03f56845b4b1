"""Host side of ``cryobox bench restart``: the measured ``cryobox serve`` (finer readiness polling, timed signal
and start), host memory, and the last-resort release of a data dir whose VMs outlive the server by design."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...agent.net.slots import tag_for
from ..childproc import ChildProcess
from ..fleetproc.system import in_thread
from ..server import ServeProcess, release_serve_state
from .analysis import parse_meminfo

KEEP_ENV = {"CRYOBOX_ON_STOP": "keep", "CRYOBOX_RATE_LIMIT_PER_S": "0"}
"""Sandboxes kept across restarts; no request rate limit (the exec clients' tight loops would meet it with few VMs,
and a refused request is not what a restart costs)."""


class BenchServe(ServeProcess):
    """``cryobox serve`` polled for ``/healthz`` every 20 ms, so start-up is timed to about that."""

    poll_interval_s = 0.02


STARTUP_MARKS = {
    "imported": "cryobox data dir ",  # serve's first line: the interpreter is up and its code imported
    "adopted": " from the previous agent",  # "adopted N sandbox(es) from the previous agent (M lost)"
    "templates_ready": "templates ready",
    "listening": "Uvicorn running on",
}
STOP_MARKS = {"stopped": "stopped ("}
"""serve's own line once the host is closed: what follows it until the exit is the interpreter's teardown."""


class LogWatch(threading.Thread):
    """Polls a log file every 20 ms from its current end and records when each marker first appears (monotonic
    seconds since ``t0``), so a start-up or a stop can be split into its steps."""

    def __init__(self, path: Path, marks: Mapping[str, str], t0: float) -> None:
        super().__init__(name="log-watch", daemon=True)
        self.path, self.marks, self.t0 = path, dict(marks), t0
        self.offset = path.stat().st_size if path.exists() else 0
        self.seen: dict[str, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        pending = ""
        while True:
            halted = self._halt.is_set()
            with contextlib.suppress(OSError), open(self.path, "rb") as log:
                log.seek(self.offset)
                chunk = log.read()
                self.offset += len(chunk)
                pending += chunk.decode(errors="replace")
            now = round(time.monotonic() - self.t0, 3)
            for name, text in self.marks.items():
                if name not in self.seen and text in pending:
                    self.seen[name] = now
            pending = pending[-500:]  # a marker split across two reads is still found
            if halted or len(self.seen) == len(self.marks):
                return
            self._halt.wait(0.02)

    def finish(self) -> dict[str, float]:
        self._halt.set()
        self.join(timeout=5)
        return dict(self.seen)


def signal_and_wait(child: ChildProcess, sig: int, timeout_s: float) -> dict[str, Any]:
    """Send ``sig`` and time until the process exits; past ``timeout_s`` it is SIGKILLed (``forced``). ``marks_s``:
    when its log said it had stopped (see :data:`STOP_MARKS`)."""
    proc = child.proc
    if proc is None or proc.poll() is not None:
        raise RuntimeError(f"{child.what} is not running (exit code {None if proc is None else proc.returncode})")
    t0 = time.monotonic()
    watch = LogWatch(child.log_path, STOP_MARKS, t0)
    watch.start()
    proc.send_signal(sig)
    forced = False
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        forced = True
        proc.kill()
        code = proc.wait()
    elapsed = round(time.monotonic() - t0, 3)
    return {"signal_to_exit_s": elapsed, "exit_code": code, "forced": forced, "marks_s": watch.finish()}


def timed_start(child: ChildProcess, timeout_s: float = 600.0) -> tuple[float, dict[str, float]]:
    """Launch and wait until ready: (seconds from launch until the readiness check first passed, when each of
    :data:`STARTUP_MARKS` appeared in its log)."""
    t0 = time.monotonic()
    watch = LogWatch(child.log_path, STARTUP_MARKS, t0)
    watch.start()
    try:
        child.launch()
        child.wait_ready(timeout_s)
    finally:
        marks = watch.finish()
    return time.monotonic() - t0, marks


def guest_cpu_cores(data_dir: Path, seconds: float = 3.0) -> float:
    """CPU (in cores) the processes naming ``data_dir`` (its QEMUs, the memory server) use over ``seconds``."""

    def ticks() -> int:
        total = 0
        for pid in processes_naming(data_dir):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total

    before, t0 = ticks(), time.monotonic()
    time.sleep(seconds)
    return round((ticks() - before) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0), 2)


def import_seconds() -> float:
    """How long a fresh interpreter takes to import ``cryobox serve``'s code: the floor of every start-up here."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import cryobox.cli.serve"], check=True, capture_output=True)
    return time.monotonic() - t0


def mem_available_kb() -> int:
    return parse_meminfo(Path("/proc/meminfo").read_text()).get("MemAvailable", 0)


def processes_naming(path: Path) -> list[int]:
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def reclaim_data_dir(data_dir: Path, cache_dir: Path | None) -> list[int]:
    """Everything a ``cryobox serve`` with ``data_dir`` may leave running (its VMs outlive it by design): SIGKILL
    every process naming the data dir (QEMUs, the memory server; all started by this bench), then release the
    memory server's mount, the volume, the hot directory, the network namespaces and nft table of its tag.
    Returns the pids it killed."""
    pids = processes_naming(data_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    release_serve_state(data_dir, cache_dir)  # also the VMs' cgroups and the owner record
    from ...agent.net.firewall import remove_table
    from ...agent.net.netlink import NetworkSetupError, reclaim

    tag = tag_for(data_dir)
    in_thread(lambda: reclaim(tag))  # netlink calls must not run on an event loop thread
    with contextlib.suppress(NetworkSetupError):  # nft is missing: there is no table either
        remove_table(tag)  # and the host's routing as it was, if it was the last (a bare ``nft delete`` left it on)
    return pids
