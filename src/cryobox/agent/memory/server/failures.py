"""The fetch failures the memory server remembers, per image, to explain a VM that died of one.

A record carries when it happened (``at``, on a clock every process of the host shares: ``CLOCK_BOOTTIME`` by
default, the clock ``/proc/<pid>/stat`` start times are counted in) and a sequence number. A fetch of the image
that *began* after a failure was recorded and then succeeded clears it (the store answers again; a success that
was already under way when the failure happened does not), and a query may ask only for failures recorded at or
after ``since`` (the VM's start): a VM that dies later of something else is not blamed on an old outage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ....errors import CryoboxError
from ....util.procfs import boot_clock

__all__ = ["FailureLog", "FailureRecord", "boot_clock"]

E = TypeVar("E", bound=CryoboxError)


@dataclass(frozen=True)
class FailureRecord(Generic[E]):
    error: E
    at: float
    """When it was recorded, by the log's clock."""
    seq: int


class FailureLog(Generic[E]):
    """The latest failure per key (an image identity or file name); thread-safe."""

    def __init__(self, clock: Callable[[], float] = boot_clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self._records: dict[str, FailureRecord[E]] = {}

    def mark(self) -> int:
        """Taken when a fetch begins; hand it to :meth:`succeeded` when that fetch succeeds."""
        with self._lock:
            return self._seq

    def record(self, key: str, error: E) -> FailureRecord[E]:
        with self._lock:
            self._seq += 1
            record = self._records[key] = FailureRecord(error, self._clock(), self._seq)
            return record

    def succeeded(self, key: str, mark: int) -> None:
        """A fetch of ``key`` that began at ``mark`` succeeded: forget a failure recorded before it began."""
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.seq <= mark:
                del self._records[key]

    def latest(self, key: str, since: float | None = None) -> FailureRecord[E] | None:
        """The latest failure of ``key`` not cleared since, if it was recorded at or after ``since``."""
        with self._lock:
            record = self._records.get(key)
        if record is None or (since is not None and record.at < since):
            return None
        return record

    def forget(self, key: str) -> None:
        with self._lock:
            self._records.pop(key, None)
