"""When each step of a stop or a start ended, counted from its beginning: one line in the log (``stop: drained
+0.012 s, …``, ``start: …``), so an operator (and ``cryobox bench restart``) sees where a restart's window goes."""

from __future__ import annotations

import time
from collections.abc import Callable


class StepTimes:
    """Marks of one stop or start. :meth:`begin` (the signal, the lock taken) sets the origin; a mark before it
    counts from the first mark."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self._clock = clock
        self._origin: float | None = None
        self.marks: list[tuple[str, float]] = []

    def begin(self) -> None:
        if self._origin is None:
            self._origin = self._clock()

    def mark(self, step: str) -> None:
        now = self._clock()
        if self._origin is None:
            self._origin = now
        self.marks.append((step, now - self._origin))

    def describe(self) -> str:
        """``{what}: drained +0.012 s, …`` (empty when nothing was marked)."""
        if not self.marks:
            return ""
        return f"{self.what}: " + ", ".join(f"{step} +{seconds:.3f} s" for step, seconds in self.marks)
