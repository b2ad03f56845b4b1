"""``cryobox bench code``: what a stateful kernel baked warm into ``code-interpreter`` saves, measured side by side.

Against a real ``cryobox serve`` (pre-spawn 0: every create restores the template), ``n`` times each:

1. ``first_run_code_ms``: create a ``code-interpreter`` sandbox, then its first ``run_code("1+1")``, client wall
   time (SDK call to answer) and server side (the execution's ``duration_ms``: control plane → kernel → back);
2. ``first_dataframe_ms``: in a second fresh sandbox, its first ``run_code`` rendering a DataFrame (HTML);
3. ``import_pandas_ms``: in a third fresh sandbox, ``exec("python3 -c 'import pandas'")`` — what every call cost
   before the kernel (a new process importing pandas under TCG);
4. ``steady_run_code_ms``: ``run_code("1+1")`` repeated in one sandbox (``n * 10`` samples), p50/p99.

``speedup_first_run_code`` and ``speedup_first_dataframe``: ``import_pandas_ms.p50`` over each first-call p50
(client wall). Everything created is deleted in ``finally``.
"""

from __future__ import annotations

import os
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from ..sdk import Sandbox
from ..util.progress import Reporter
from .report import write_result
from .server import ServeProcess
from .snapshot import qemu_version
from .snapshot_report import BenchError
from .stats import stats, timed

TEMPLATE = "code-interpreter"
IMPORT_PANDAS = "python3 -c 'import pandas'"
NOTES = {
    "first_run_code_ms": "a fresh code-interpreter sandbox's first run_code('1+1'): SDK wall and server duration",
    "first_dataframe_ms": "a fresh sandbox's first run_code rendering a DataFrame to HTML",
    "import_pandas_ms": "a fresh sandbox's exec(python3 -c 'import pandas'): a new process importing pandas",
    "steady_run_code_ms": "run_code('1+1') again and again in one warm sandbox",
}


def measure(url: str, key: str, n: int, console: Console, progress: Reporter) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {
        "first_wall": [],
        "first_server": [],
        "frame_wall": [],
        "frame_server": [],
        "pandas_wall": [],
        "pandas_server": [],
        "steady_wall": [],
        "steady_server": [],
    }
    rounds = progress.phase("first-call rounds", n)
    for round_ in range(n):
        for kind in ("first", "frame", "pandas"):
            sbx = Sandbox.create(template=TEMPLATE, api_url=url, api_key=key)
            try:
                if kind == "first":
                    wall, execution = timed(partial(sbx.run_code, "1+1"))
                    if execution.text != "2":
                        raise BenchError(f"run_code('1+1') answered {execution.text!r}")
                    server = execution.duration_ms
                elif kind == "frame":
                    code = "import pandas as pd\npd.DataFrame({'a': range(5), 'b': range(5)})"
                    wall, execution = timed(partial(sbx.run_code, code))
                    if not execution.results or "<table" not in (execution.results[0].html or ""):
                        raise BenchError("the DataFrame did not render to HTML")
                    server = execution.duration_ms
                else:
                    wall, result = timed(partial(sbx.exec, IMPORT_PANDAS, timeout_seconds=120))
                    if result.exit_code != 0:
                        raise BenchError(f"import pandas failed: {result.stderr}")
                    server = result.duration_ms
                samples[f"{kind}_wall"].append(wall)
                samples[f"{kind}_server"].append(server)
            finally:
                sbx.kill()
        first, frame, pandas = (samples[f"{k}_wall"][-1] for k in ("first", "frame", "pandas"))
        console.print(
            f"round {round_ + 1}/{n}: first 1+1 {first:.0f} ms, DataFrame {frame:.0f} ms, import pandas {pandas:.0f} ms"
        )
        rounds.advance()
    rounds.finish()
    sbx = Sandbox.create(template=TEMPLATE, api_url=url, api_key=key)
    try:
        sbx.run_code("1+1")
        with progress.phase("steady run_code", n * 10) as steady:
            for _ in range(n * 10):
                wall, execution = timed(lambda: sbx.run_code("1+1"))
                samples["steady_wall"].append(wall)
                samples["steady_server"].append(execution.duration_ms)
                steady.advance()
    finally:
        sbx.kill()
    return samples


def build_result(samples: dict[str, list[float]], *, n: int, qemu: str) -> dict[str, Any]:
    def pair(kind: str) -> dict[str, dict[str, float]]:
        return {"client": stats(samples[f"{kind}_wall"]), "server": stats(samples[f"{kind}_server"])}

    first, frame, pandas = pair("first"), pair("frame"), pair("pandas")
    return {
        "bench": "code",
        "template": TEMPLATE,
        "n": n,
        "cores": os.cpu_count() or 0,
        "qemu": qemu,
        "first_run_code_ms": first,
        "first_dataframe_ms": frame,
        "import_pandas_ms": pandas,
        "steady_run_code_ms": pair("steady"),
        "speedup_first_run_code": round(pandas["client"]["p50"] / max(first["client"]["p50"], 0.1), 1),
        "speedup_first_dataframe": round(pandas["client"]["p50"] / max(frame["client"]["p50"], 0.1), 1),
        "notes": NOTES,
    }


def run_code_bench(
    *, n: int, out_dir: Path, cache_dir: Path | None, console: Console, progress: Reporter
) -> dict[str, Any]:
    if n < 1:
        raise BenchError("--n must be at least 1")
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-code-") as tmp:
        console.print("starting cryobox serve (prespawn 0)")
        with ServeProcess(Path(tmp) / "data", cache_dir=cache_dir, prespawn=0) as server:
            samples = measure(server.url, server.api_key, n, console, progress)
    result = build_result(samples, n=n, qemu=qemu_version())
    result["path"] = str(write_result(out_dir, "code", result))
    return result
