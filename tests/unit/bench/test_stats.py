"""Nearest-rank percentiles."""

from __future__ import annotations

import pytest

from cryobox.bench.stats import percentile, stats

DATA = [50.0, 15.0, 40.0, 20.0, 35.0]  # deliberately unsorted


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0, 15.0), (5, 15.0), (20, 15.0), (30, 20.0), (40, 20.0), (50, 35.0), (75, 40.0), (80, 40.0), (100, 50.0)],
)
def test_percentile_nearest_rank(q: float, expected: float) -> None:
    assert percentile(DATA, q) == expected


def test_percentile_hundred_samples() -> None:
    samples = [float(i) for i in range(100, 0, -1)]  # 1..100, reversed
    assert percentile(samples, 50) == 50.0
    assert percentile(samples, 90) == 90.0
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 99.5) == 100.0


def test_percentile_does_not_mutate() -> None:
    samples = list(DATA)
    percentile(samples, 50)
    assert samples == DATA


def test_single_sample() -> None:
    assert percentile([7.0], 0) == 7.0
    assert percentile([7.0], 99) == 7.0


def test_stats() -> None:
    samples = [1.04, 2.26, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.56]
    assert stats(samples) == {"p50": 5.0, "p90": 9.0, "p99": 10.6, "max": 10.6}
