"""Summary statistics for benchmark samples."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """``fn()``'s wall time in ms (monotonic clock) and its value."""
    started = time.monotonic()
    value = fn()
    return (time.monotonic() - started) * 1000, value


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(samples, 50), 1),
        "p90": round(percentile(samples, 90), 1),
        "p99": round(percentile(samples, 99), 1),
        "max": round(max(samples), 1),
    }


def permutation_p(a: list[float], b: list[float], *, rounds: int = 10_000, seed: int = 0) -> float | None:
    """Two-sided p-value of the difference of medians of ``a`` and ``b`` under the hypothesis that both are samples
    of one distribution: the share of ``rounds`` random relabelings of the pooled samples whose difference is at least
    as large as the one observed (with the usual +1 so it is never 0). Small means the difference is real; as
    Firecracker's A/B tests judge theirs. ``None`` without samples on both sides."""
    if not a or not b:
        return None
    observed = abs(statistics.median(b) - statistics.median(a))
    pooled = [*a, *b]
    rng = random.Random(seed)
    hits = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        if abs(statistics.median(pooled[len(a) :]) - statistics.median(pooled[: len(a)])) >= observed:
            hits += 1
    return (hits + 1) / (rounds + 1)
