"""Threads for background work that must not slow what a user waits on.

A snapshot's copy to the object store hashes its whole memory image (two threads) right after the snapshot
returns; on a host with few cores it competes with the next snapshot's pause and settle, and slows them
(docs/SPECIFICATION.md). Work run here gets a lower CPU priority (``nice``), inherited by
the threads it starts: the scheduler gives the latency-critical threads the cores first, and the background
work everything left over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
NICE = 10


def _lower_priority(nice: int) -> None:
    # Linux: the "process" priority of thread id 0 is the calling thread's own (threads it starts inherit it)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))  # never raised


class Background:
    """A small pool of lower-priority threads (:meth:`run` is ``asyncio.to_thread`` on them)."""

    def __init__(self, workers: int = 2, nice: int = NICE, name: str = "background") -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=_lower_priority, initargs=(nice,))

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
