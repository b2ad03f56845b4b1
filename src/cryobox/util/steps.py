"""Where time went, step by step: a request's, for ``Server-Timing`` (``name;dur=ms``, comma-separated), and a stop's
or a start's, as one log line (:class:`StepTimes`: ``stop: drained +0.012 s, …``), so an operator (and ``cryobox bench
restart``) sees where a restart's window goes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, MutableMapping


@contextlib.contextmanager
def step(
    timing: MutableMapping[str, float] | None, name: str, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """Add the block's wall time (ms) to ``timing[name]``, if a ``timing`` is given (the block may await)."""
    if timing is None:
        yield
        return
    started = clock()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + (clock() - started) * 1000


def server_timing(timing: MutableMapping[str, float]) -> str:
    """``Server-Timing``'s value for ``timing`` (in its order; names as given, durations to 0.01 ms)."""
    return ", ".join(f"{name};dur={ms:.2f}" for name, ms in timing.items())


def read_server_timing(value: str) -> dict[str, float]:
    """The steps of a ``Server-Timing`` value and their durations (ms); an entry without a readable ``dur`` is
    left out."""
    steps: dict[str, float] = {}
    for entry in value.split(","):
        name, _, rest = entry.strip().partition(";")
        if name and rest.startswith("dur="):
            with contextlib.suppress(ValueError):
                steps[name] = float(rest[4:])
    return steps


def call_timing(
    started: float, timing: MutableMapping[str, float], clock: Callable[[], float] = time.monotonic, **after: float
) -> str:
    """``Server-Timing`` of a call that began at ``started`` (``clock``'s time): ``control`` first, what of it was
    not the agent's (``timing["agent"]``), then ``timing``'s steps, then ``after`` (ms)."""
    control_ms = (clock() - started) * 1000 - timing.get("agent", 0.0)
    return server_timing({"control": control_ms, **timing, **after})


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
