"""Host side of ``cryobox bench restart``: the measured ``cryobox serve`` (finer readiness polling, timed signal
and start), host memory, and the last-resort release of a data dir whose VMs outlive the server by design."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...agent.net.slots import tag_for
from ..childproc import ChildProcess
from ..fleetproc.system import in_thread
from ..server import ServeProcess, release_serve_state
from .analysis import parse_meminfo

KEEP_ENV = {"CRYOBOX_ON_STOP": "keep"}


class BenchServe(ServeProcess):
    """``cryobox serve`` polled for ``/healthz`` every 20 ms, so start-up is timed to about that."""

    poll_interval_s = 0.02


def signal_and_wait(child: ChildProcess, sig: int, timeout_s: float) -> dict[str, Any]:
    """Send ``sig`` and time until the process exits; past ``timeout_s`` it is SIGKILLed (``forced``)."""
    proc = child.proc
    if proc is None or proc.poll() is not None:
        raise RuntimeError(f"{child.what} is not running (exit code {None if proc is None else proc.returncode})")
    t0 = time.monotonic()
    proc.send_signal(sig)
    forced = False
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        forced = True
        proc.kill()
        code = proc.wait()
    return {"signal_to_exit_s": round(time.monotonic() - t0, 3), "exit_code": code, "forced": forced}


def timed_start(child: ChildProcess, timeout_s: float = 600.0) -> float:
    """Launch and wait until ready; seconds from launch until the readiness check first passed."""
    t0 = time.monotonic()
    child.launch()
    child.wait_ready(timeout_s)
    return time.monotonic() - t0


def import_seconds() -> float:
    """How long a fresh interpreter takes to import ``cryobox serve``'s code: the floor of every start-up here."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import cryobox.cli.serve"], check=True, capture_output=True)
    return time.monotonic() - t0


def mem_available_kb() -> int:
    return parse_meminfo(Path("/proc/meminfo").read_text()).get("MemAvailable", 0)


def _processes_naming(path: Path) -> list[int]:
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
    pids = _processes_naming(data_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    release_serve_state(data_dir, cache_dir)
    if data_dir.exists():
        from ...agent.net.netlink import reclaim

        tag = tag_for(data_dir)
        in_thread(lambda: reclaim(tag))  # netlink calls must not run on an event loop thread
        subprocess.run(["nft", "delete", "table", "inet", f"cryobox_{tag}"], capture_output=True, check=False)
    return pids
