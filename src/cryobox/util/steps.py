"""Where a request's time went, step by step, for ``Server-Timing`` (``name;dur=ms``, comma-separated)."""

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
