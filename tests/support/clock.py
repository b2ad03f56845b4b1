"""The one fake clock of the test suite: code under test takes its clock (and its sleep) as a parameter, and the
tests hand it this, so time moves only when a test moves it or when the code sleeps."""

from __future__ import annotations

import threading

T0 = 1_000_000.0
"""A wall-clock time far from 0 (rows and reservations compare against it)."""


class FakeClock:
    """A ``time.time`` / ``time.monotonic`` stand-in (call it) that moves only when told to (:meth:`advance`, or by
    setting :attr:`now`) or when something sleeps on it (:meth:`sleep`, :meth:`async_sleep`: the time passes at
    once, and every sleep is recorded in :attr:`sleeps`). Safe to read, advance and sleep on from several threads."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``."""
        with self._lock:
            self.now += seconds

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)
