"""Summary statistics for benchmark samples."""

from __future__ import annotations

import math


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
