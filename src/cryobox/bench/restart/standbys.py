"""The bench as the service's supervisor with a warm standby (:mod:`cryobox.compose.standby`): it holds the
listening socket, restarts ``cryobox serve`` after every SIGKILL or SIGTERM as systemd's ``Restart=`` would, and
follows which process serves (the standby that took over) and which stands by (the start that claimed it)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

from ..server import ServeProcess
from .successor import Adopted, lock_holder

REGISTERED = re.compile(r"standby pid (\d+) registered")


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def logged_steps(path: Path, offset: int, what: str = "stop") -> dict[str, float]:
    """The steps of the first stop (or start: ``what``) a serve logged after ``offset`` (its ``stop: drained
    +0.012 s, …`` line, :mod:`cryobox.util.steps`): seconds from its beginning to each step's end; empty if
    none."""
    if not path.exists():
        return {}
    prefix = f"{what}: "
    with open(path, "rb") as log:
        log.seek(offset)
        lines = [line for line in log.read().decode(errors="replace").splitlines() if line.startswith(prefix)]
    if not lines:
        return {}
    steps: dict[str, float] = {}
    for part in lines[0].removeprefix(prefix).split(", "):
        step, _, seconds = part.rpartition(" +")
        with contextlib.suppress(ValueError):
            steps[step] = float(seconds.removesuffix(" s"))
    return steps


def wait_registered(path: Path, offset: int, timeout_s: float) -> int:
    """The pid of the first standby the log shows registered after ``offset``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(path, "rb") as log:
            log.seek(offset)
            found = REGISTERED.search(log.read().decode(errors="replace"))
        if found:
            return int(found.group(1))
        time.sleep(0.05)
    raise RuntimeError(f"no standby registered within {timeout_s:.0f} s (see {path})")


def follow_server(
    serve: ServeProcess,
    launched: list[subprocess.Popen[bytes]],
    old: int,
    claimer: subprocess.Popen[bytes],
    *,
    asked: bool,
    timeout_s: float,
) -> None:
    """Point ``serve.proc`` at the process that serves the data dir after ``old`` (the lock's holder): the
    ``claimer`` (the bench's restart) when it ``asked`` to take over (another configuration), else the standby that
    took over — a ``Popen`` this bench launched, or one it adopted as the subreaper."""
    deadline = time.monotonic() + timeout_s
    while True:
        holder = lock_holder(serve.data_dir)
        if holder is not None and holder != old and (holder == claimer.pid) == asked:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"no process took {serve.data_dir} over from pid {old} (holder {holder})")
        time.sleep(0.01)
    serve.proc = next((p for p in launched if p.pid == holder), None) or Adopted(holder)
