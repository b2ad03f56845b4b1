"""The process an upgrade (``SIGUSR2``, :mod:`cryobox.compose.handover`) leaves serving, as the bench's own child.

The successor is started by the old ``serve``, so when that one exits it is re-parented: to this process once it is
a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so it can be signalled, waited for and reaped like the
``subprocess.Popen`` the harness started. Its pid is the one the data dir's ``agent.lock`` names.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans of this process's descendants are re-parented here (Linux), so a successor can be reaped."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def lock_holder(data_dir: Path) -> int | None:
    """The pid ``<data_dir>/agent.lock`` names (the agent that holds the data dir, or held it last)."""
    with contextlib.suppress(OSError, ValueError):
        return int((data_dir / "agent.lock").read_text().strip())
    return None


def wait_successor(data_dir: Path, old: int, timeout_s: float) -> int:
    """The pid that took ``data_dir`` over from ``old``; ``TimeoutError`` if none did in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = lock_holder(data_dir)
        if pid is not None and pid != old:
            return pid
        time.sleep(0.01)
    raise TimeoutError(f"no process took {data_dir} over from pid {old} within {timeout_s}s")


class Adopted(subprocess.Popen[bytes]):
    """A ``Popen`` for a process this one did not start but reaps (a subreaper's re-parented grandchild): the
    methods the harness uses (``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``), nothing else."""

    def __init__(self, pid: int) -> None:  # noqa: D107 - Popen's own __init__ starts a process: not called
        self.pid = pid
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:  # Popen's would warn about a process it never started
        pass
