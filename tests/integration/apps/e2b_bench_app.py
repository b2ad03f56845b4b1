"""``commands.run("true")`` through E2B's Python SDK: the counterpart of ``tests/js/bench_run_true.mjs`` (same N,
warm-up and quantiles) for the same server. Not part of ``make test``; run in the E2B SDK's virtualenv with the
variables of :func:`tests.support.e2b.e2b_env`: ``python tests/integration/apps/e2b_bench_app.py [N]``."""

from __future__ import annotations

import json
import math
import sys
import time

from e2b import Sandbox

WARMUP = 3


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    sbx = Sandbox.create(metadata={"app": "e2b-py-bench"})
    try:
        for _ in range(WARMUP):
            sbx.commands.run("true")
        ms = []
        for _ in range(n):
            started = time.perf_counter()
            sbx.commands.run("true")
            ms.append((time.perf_counter() - started) * 1000)
        ms.sort()
        out = {"sdk": "e2b-python", "n": n, "p50": round(quantile(ms, 0.5), 2), "p95": round(quantile(ms, 0.95), 2)}
        print(json.dumps({**out, "min": round(ms[0], 2), "max": round(ms[-1], 2)}))
    finally:
        sbx.kill()


if __name__ == "__main__":
    main()
