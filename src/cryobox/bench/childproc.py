"""A ``cryobox`` command as a child process (serve, control, agent): spawn with a log file, readiness poll, stop
by PID (``sig`` then SIGKILL), restart, ``cleanup()`` of what it leaves on the host, and a context manager."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx


def stop_popen(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> int | None:
    """Send ``sig`` (when still running), wait up to ``timeout_s``, then SIGKILL; the exit code (None: never run)."""
    if proc is None:
        return None
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class ChildProcess:
    """Common lifecycle of one child: subclasses say how to run it (:meth:`argv`, :meth:`child_env`), when it is
    up (:meth:`ready`; an ``httpx.HTTPError`` counts as not yet) and what a dead one leaves (:meth:`cleanup`)."""

    what = "process"
    start_timeout_s = 300.0
    poll_interval_s = 0.2
    cleanup_on_timeout = False
    """Whether a start that times out also runs :meth:`cleanup` (after stopping the child)."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def child_env(self) -> dict[str, str]:
        """The child's environment."""
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def cleanup(self) -> None:
        """After :meth:`stop`: release what the child may have left behind (also when it was killed)."""

    def launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=log, env=self.child_env(), stdin=subprocess.DEVNULL
            )

    def wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.what} exited with {self.proc.returncode}; see {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if self.ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(self.poll_interval_s)
        self.stop()
        if self.cleanup_on_timeout:
            self.cleanup()
        raise RuntimeError(f"{self.what} did not come up within {timeout_s}s; see {self.log_path}:\n{self.log_tail()}")

    def start(self, timeout_s: float | None = None) -> Self:
        """Launch and wait until ready (``timeout_s``: default :attr:`start_timeout_s`)."""
        self.launch()
        self.wait_ready(self.start_timeout_s if timeout_s is None else timeout_s)
        return self

    def restart(self, sig: int = signal.SIGTERM, timeout_s: float | None = None) -> Self:
        self.stop(sig)
        return self.start(timeout_s)

    def log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-size:]
        return "(no log)"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """Idempotent: the exit code (``None`` when never started)."""
        return stop_popen(self.proc, sig, timeout_s)

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self.cleanup()
