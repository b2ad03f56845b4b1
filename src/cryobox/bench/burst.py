"""``cryobox bench burst``: N simultaneous creates of one template whose memory is only in the object store.

Three bursts in one run, each against a fresh ``cryobox serve --memory lazy --prespawn 0`` behind the same
store-side latency/bandwidth injector:

``cold``   empty host chunk cache: every chunk a guest touches is fetched (single-flight, once per host);
``warm``   the same data dir after a restart: the durable chunk cache answers, no GETs;
``naive``  empty cache, with single-flight and the chunk cache turned off: every read fetches its chunk.

A preparatory serve (its own data dir) first makes sure the template is published with its prefetch trace, so
the measured bursts start from exactly the state they claim. Each RUN reports create latency percentiles (request
sent → sandbox ready), object-store GETs (chunk range GETs, retries included), faults (reads the memory server
served), unique chunks the guests touched and fetches/faults.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from ..config import DEFAULT_CACHE_DIR, Paths
from ..errors import CryoboxError
from ..util.progress import Phase, Reporter
from .report import write_result
from .server import ServeProcess
from .stats import percentile

DEFAULT_FAULTS = "latency_ms=30,bandwidth_mbps=800"
"""A store 30 ms away behind a shared 800 Mbit/s link (about what one host sees from a regional S3 bucket)."""

RUN_KEYS = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "store_gets", "faults", "unique_chunks", "fetch_fault_ratio")


def _serve(
    data_dir: Path, cache_dir: Path | None, template: str, faults: str, concurrency: int, naive: bool, n: int
) -> ServeProcess:
    args = ["--memory", "lazy", "--net-pool", str(min(n, 64)), "--max-concurrent-restores", str(concurrency)]
    args += ["--admission-queue", str(max(64, n)), "--admission-timeout", "900"]
    if faults:
        args += ["--store-faults", faults]
    if naive:
        args.append("--naive-memory")
    return ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=args)


async def _stats(data_dir: Path, cache_dir: Path | None) -> dict[str, Any]:
    sock = Paths(data_dir, cache_dir or DEFAULT_CACHE_DIR).memserver_dir / "control.sock"
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sock)), base_url="http://m") as client:
        response = await client.get("/stats")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


async def _burst(serve: ServeProcess, template: str, n: int, phase: Phase) -> tuple[list[float], list[str]]:
    """Fire ``n`` creates at once; returns each one's latency (ms) and the sandbox ids; kills them after."""
    headers = {"Authorization": f"Bearer {serve.api_key}"}
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=serve.url, headers=headers, timeout=900, limits=limits) as client:
        start = asyncio.Event()

        async def one() -> tuple[float, str]:
            await start.wait()
            t0 = time.monotonic()
            response = await client.post("/v1/sandboxes", json={"template": template, "ttl_seconds": 600})
            elapsed = (time.monotonic() - t0) * 1000
            phase.advance()
            if response.status_code >= 300:
                raise RuntimeError(f"create failed: {response.status_code} {response.text}")
            return elapsed, str(response.json()["id"])

        tasks = [asyncio.create_task(one()) for _ in range(n)]
        await asyncio.sleep(0.2)
        start.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        ids = [r[1] for r in results if isinstance(r, tuple)]
        await asyncio.gather(*(client.delete(f"/v1/sandboxes/{i}") for i in ids), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} creates failed; first: {errors[0]}")
    return [r[0] for r in results if isinstance(r, tuple)], ids


def summarize(latencies: list[float], stats: dict[str, Any]) -> dict[str, Any]:
    metrics = stats["metrics"]
    touched = sum(int(image["touched_stored"]) for image in stats["images"].values())
    faults = int(metrics["faults"])
    fetches = int(metrics["chunk_fetches"])
    return {
        "p50_ms": round(percentile(latencies, 50), 1),
        "p90_ms": round(percentile(latencies, 90), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
        "store_gets": int(metrics["store_gets"]),
        "faults": faults,
        "unique_chunks": touched,
        "fetch_fault_ratio": round(fetches / faults, 4) if faults else 0.0,
        "chunk_fetches": fetches,
        "cache_hits": int(metrics["cache_hits"]),
        "zero_fills": int(metrics["zero_fills"]),
        "prefetch_hits": int(metrics["prefetch_hits"]),
        "store_get_mib": round(int(stats["store"]["get_bytes"]) / 2**20, 1),
        "latencies_ms": [round(x, 1) for x in sorted(latencies)],
    }


def _run_one(
    name: str,
    data_dir: Path,
    cache_dir: Path | None,
    template: str,
    faults: str,
    concurrency: int,
    n: int,
    console: Console,
    progress: Reporter,
) -> dict[str, Any]:
    serve = _serve(data_dir, cache_dir, template, faults, concurrency, name == "naive", n)
    with serve:
        console.print(f"[bold]{name}[/bold]: {n} creates at once (serve pid {serve.pid})")
        with progress.phase(f"{name}: creates answered", n) as phase:
            latencies, _ = asyncio.run(_burst(serve, template, n, phase))
        stats = asyncio.run(_stats(data_dir, cache_dir))
    run = summarize(latencies, stats)
    console.print(f"  p50 {run['p50_ms']} ms, p99 {run['p99_ms']} ms, GETs {run['store_gets']}, faults {run['faults']}")
    return run


def run_burst_bench(
    *,
    n: int,
    template: str,
    faults: str,
    concurrency: int,
    out_dir: Path,
    cache_dir: Path | None,
    plot: Path | None,
    console: Console,
    progress: Reporter,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="cryobox-burst-", dir="/var/tmp"))
    try:
        console.print("preparing: template published with its prefetch trace")
        with progress.phase("preparing"), _serve(root / "prepare", cache_dir, template, "", concurrency, False, n):
            pass
        runs = progress.phase("runs: cold, warm, naive", 3)
        cold = _run_one("cold", root / "host", cache_dir, template, faults, concurrency, n, console, progress)
        runs.advance()
        warm = _run_one("warm", root / "host", cache_dir, template, faults, concurrency, n, console, progress)
        runs.advance()
        naive = _run_one("naive", root / "naive", cache_dir, template, faults, concurrency, n, console, progress)
        runs.advance()
        runs.finish()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "n": n,
        "cold": cold,
        "warm": warm,
        "naive": naive,
        "template": template,
        "store_faults": faults,
        "max_concurrent_restores": concurrency,
        "ratios": {
            "cold_gets_per_unique_chunk": round(cold["store_gets"] / cold["unique_chunks"], 3)
            if cold["unique_chunks"]
            else None,
            "naive_p99_over_cold_p99": round(naive["p99_ms"] / cold["p99_ms"], 2),
            "cold_p99_over_p50": round(cold["p99_ms"] / cold["p50_ms"], 2),
            "warm_p99_over_p50": round(warm["p99_ms"] / warm["p50_ms"], 2),
        },
    }
    path = write_result(out_dir, "burst", result)
    _print(result, console)
    console.print(f"wrote {path}")
    if plot is not None:
        draw(result, plot)
        console.print(f"plot {plot}")
    return result


def _print(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"burst of {result['n']} creates ({result['template']}, store faults {result['store_faults']})")
    table.add_column("")
    runs = ("cold", "warm", "naive")
    for name in runs:
        table.add_column(name, justify="right")
    for key in RUN_KEYS:
        table.add_row(key, *(str(result[name][key]) for name in runs))
    console.print(table)
    console.print(" ".join(f"{k}={v}" for k, v in result["ratios"].items()))


def draw(result: dict[str, Any], out: Path) -> None:
    """Latency CDF of the three bursts, and their GETs and faults, side by side."""
    try:
        import matplotlib
    except ImportError:
        raise CryoboxError("--plot needs matplotlib (pip install matplotlib; `make setup` installs it)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, colour in (("cold", "tab:blue"), ("warm", "tab:green"), ("naive", "tab:red")):
        xs = result[name]["latencies_ms"]
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        cdf.step(xs, ys, where="post", label=f"{name} (p99 {result[name]['p99_ms']:.0f} ms)", color=colour)
    cdf.set_xlabel("create latency (ms)")
    cdf.set_ylabel("fraction of creates")
    cdf.set_title(f"{result['n']} simultaneous creates")
    cdf.legend()
    names = ["cold", "warm", "naive"]
    width = 0.38
    xs_bar = range(len(names))
    bars.bar([x - width / 2 for x in xs_bar], [result[k]["store_gets"] for k in names], width, label="store GETs")
    bars.bar([x + width / 2 for x in xs_bar], [result[k]["unique_chunks"] for k in names], width, label="unique chunks")
    bars.set_xticks(list(xs_bar), names)
    bars.set_yscale("symlog")
    bars.set_title("object-store GETs vs chunks touched")
    bars.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
