"""Small OS helpers shared by the agent and the bench harness: a throwaway thread, a PID liveness check, a
stopping process's priority."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def in_fresh_thread(fn: Callable[[], T], *, name: str = "cryobox-netns") -> T:
    """Run ``fn`` on a brand-new thread that dies afterwards (it may leave that thread in another netns)."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


YIELD_NICENESS = 19


def yield_cpu(niceness: int = YIELD_NICENESS, tasks: Path = Path("/proc/self/task")) -> int:
    """Lower every thread of this process to ``niceness`` (Linux keeps a niceness per thread); returns how many
    were lowered. For a process whose remaining work is its own teardown, once its successor may start: a stopping
    ``serve`` unmapped its staging reserve and exited (~0.25-0.5 s under load) on the same 2 cores as the standby
    taking over, at the same priority."""
    lowered = 0
    for tid in os.listdir(tasks):
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, int(tid), max(niceness, os.getpriority(os.PRIO_PROCESS, int(tid))))
            lowered += 1
    return lowered


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (someone else's counts: signalling it is refused, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


CONTROL_SECRETS = ("CRYOBOX_API_KEY", "CRYOBOX_DATABASE_URL", "CRYOBOX_NODE_TOKEN", "CRYOBOX_SECRET_KEY")
"""What the agent's environment may hold that no helper process it starts needs."""


def scrubbed_env(*, minimal: bool = False) -> dict[str, str]:
    """The environment for a child process: without :data:`CONTROL_SECRETS`; ``minimal`` keeps ``PATH`` only
    (an unjailed QEMU needs nothing else; a jailed one gets an empty environment)."""
    if minimal:
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    return {k: v for k, v in os.environ.items() if k not in CONTROL_SECRETS}
