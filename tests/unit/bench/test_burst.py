"""The JSON shape ``cryobox bench burst`` promises: RUN keys computed from the memory server's figures."""

from __future__ import annotations

from typing import Any

from cryobox.bench.burst import RUN_KEYS, summarize


def stats(**metrics: float) -> dict[str, Any]:
    base = {"faults": 0, "chunk_fetches": 0, "store_gets": 0, "cache_hits": 0, "zero_fills": 0, "prefetch_hits": 0}
    return {
        "metrics": {**base, **metrics},
        "store": {"get_bytes": 3 << 22},
        "images": {"templates+base+g": {"touched": 40, "touched_stored": 30}, "other": {"touched_stored": 2}},
    }


def test_run_has_every_promised_key_and_the_herd_ratio() -> None:
    run = summarize([100.0, 300.0, 200.0, 400.0], stats(faults=128, chunk_fetches=32, store_gets=33))
    assert set(RUN_KEYS) <= set(run)
    assert RUN_KEYS == (
        "p50_ms", "p90_ms", "p99_ms", "max_ms", "store_gets", "faults", "unique_chunks", "fetch_fault_ratio"
    )  # fmt: skip
    assert (run["p50_ms"], run["p99_ms"], run["max_ms"]) == (200.0, 400.0, 400.0)
    assert run["store_gets"] == 33 and run["faults"] == 128
    assert run["unique_chunks"] == 32  # stored chunks touched, over every image (zero chunks cost nothing)
    assert run["fetch_fault_ratio"] == 0.25
    assert run["store_get_mib"] == 12.0
    assert run["latencies_ms"] == [100.0, 200.0, 300.0, 400.0]


def test_a_run_without_faults_has_ratio_zero() -> None:
    assert summarize([5.0], stats())["fetch_fault_ratio"] == 0.0
