"""``cryobox bench fleet``: what splitting the platform into a control plane and host agents costs and buys.

Three measurements in one run (processes from :mod:`.fleetproc`; every agent in its own network namespace unless
``--isolation loopback``):

``hop``    the price of the HTTP hop. ``k`` sequential creates (each to its first exec answered) and ``k`` execs of
           ``true``, against ``cryobox serve`` (the in-process agent) and against a fleet of ONE ``cryobox agent`` on
           the same machine, same template, memory mode and pool size, both up at once and taking turns (A, B, B, A
           …: :mod:`.hop`). Create call latency and exec latency, p50/p99, both ways, and per operation the p-value
           of a permutation test of the two medians: whether the difference is real or noise.
``burst``  ``n`` simultaneous creates against a fleet of ``agents`` agents running ``--memory lazy
           --template-source store`` (every agent pages the template's memory from the S3 store): how many landed
           on each agent (each sandbox's ``host``), and per agent the store GETs and unique chunks touched (its
           memory server's figures: every host fetches its own copy of what its guests touch).
``restore`` ``restores`` snapshots of one sandbox on one agent, each uploaded (``location`` becomes ``stored``):
           sequential restores of the first while every agent is up (placement decides where), then the source
           agent is SIGKILLed and each snapshot is restored once more, necessarily elsewhere. A restore is
           ``same-host`` (on the source agent), ``cross-host`` (the first time another agent restores that
           snapshot: imported, memory paged from the store) or ``cross-host-repeat`` (that agent holds it already).
           Each restore checks the marker file written just before its snapshot.

The JSON keeps ``hop.{create,exec}_{p50,p99}_ms_{inproc,http}``, ``burst.{n, per_agent, store_gets_per_agent,
unique_chunks_per_agent}``, ``cross_host_restore_ok``, ``cross_host_restore_p50_ms`` and
``same_host_restore_p50_ms`` (``None`` when no restore of that kind happened).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
from rich.console import Console
from rich.table import Table

from ..errors import CryoboxError
from ..util.progress import Reporter
from .fleet_result import (
    HOP_OPS,
    assemble,
    burst_summary,
    figures_delta,
    hop_summary,
    host_to_agent,
    memserver_figures,
    parse_metrics,
    quantile,
    restore_summary,
)
from .fleetproc import AgentProcess, Fleet
from .hop import HOP_SETTLE_S, Side, by_side, checked, exec_ok, measure_hop
from .report import write_result
from .server import ServeProcess

MARKER_PATH = "/root/cbx-fleet-marker"

# -- measurements ----------------------------------------------------------------------------------------------------


async def _burst(url: str, api_key: str, template: str, n: int) -> tuple[list[float], list[str], list[str]]:
    """Fire ``n`` creates at once; (latencies of the ones that worked, their hosts, error texts); deletes after."""
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=900, limits=limits, trust_env=False) as c:
        start = asyncio.Event()

        async def one() -> tuple[float, dict[str, Any]]:
            await start.wait()
            t0 = time.monotonic()
            response = await c.post("/v1/sandboxes", json={"template": template, "ttl_seconds": 900})
            elapsed = (time.monotonic() - t0) * 1000
            return elapsed, checked(response, "create")

        tasks = [asyncio.create_task(one()) for _ in range(n)]
        await asyncio.sleep(0.2)
        start.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        done = [r for r in results if isinstance(r, tuple)]
        await asyncio.gather(*(c.delete(f"/v1/sandboxes/{r[1]['id']}") for r in done), return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    return [r[0] for r in done], [str(r[1].get("host") or "") for r in done], errors


def _agent_figures(agent: AgentProcess) -> dict[str, int | None]:
    """Store GETs and unique chunks from the memory server's control socket; GETs only from the agent's metrics
    when the socket is not there."""
    try:
        return dict(memserver_figures(agent.memserver_stats()))
    except (httpx.HTTPError, OSError):
        pass
    try:
        metrics = parse_metrics(agent.metrics_text())
    except httpx.HTTPError:
        return {"store_gets": None, "unique_chunks": None, "faults": None, "chunk_fetches": None}
    return {
        "store_gets": int(metrics.get("store_gets_total", 0)),
        "unique_chunks": None,
        "faults": int(metrics.get("faults_total", 0)),
        "chunk_fetches": int(metrics.get("chunk_fetches_total", 0)),
    }


def _delta(before: Mapping[str, int | None], after: Mapping[str, int | None]) -> dict[str, int | None]:
    if any(v is None for v in after.values()) or any(v is None for v in before.values()):
        return dict(after)
    return dict(figures_delta({k: int(v or 0) for k, v in before.items()}, {k: int(v or 0) for k, v in after.items()}))


def measure_burst(fleet: Fleet, template: str, n: int) -> dict[str, Any]:
    before = {name: _agent_figures(agent) for name, agent in fleet.agents.items()}
    latencies, hosts, errors = asyncio.run(_burst(fleet.url, fleet.api_key, template, n))
    after = {name: _agent_figures(agent) for name, agent in fleet.agents.items()}
    view = fleet.agents_view()
    names = list(fleet.agents)
    figures = {name: _delta(before[name], after[name]) for name in names}
    return burst_summary(n, latencies, [host_to_agent(h, view) for h in hosts], names, figures, errors)


def _wait_stored(client: httpx.Client, snapshot_id: str, timeout_s: float) -> tuple[float, str]:
    t0 = time.monotonic()
    location = "?"
    while time.monotonic() - t0 < timeout_s:
        location = str(checked(client.get(f"/v1/snapshots/{snapshot_id}"), "get snapshot").get("location"))
        if location == "stored":
            return (time.monotonic() - t0) * 1000, location
        time.sleep(0.25)
    raise CryoboxError(f"snapshot {snapshot_id} not stored within {timeout_s}s (location {location!r})")


def _restore_once(
    client: httpx.Client,
    snapshot: tuple[int, str, str],
    view: Mapping[str, Mapping[str, Any]],
    phase: str,
) -> dict[str, Any]:
    index, snapshot_id, token = snapshot
    sample: dict[str, Any] = {"phase": phase, "snapshot": index, "host": "?", "ok": False}
    t0 = time.monotonic()
    try:
        body = checked(client.post("/v1/sandboxes", json={"from_snapshot": snapshot_id, "ttl_seconds": 600}), "restore")
    except (CryoboxError, httpx.HTTPError) as err:
        return {**sample, "ms": round((time.monotonic() - t0) * 1000, 1), "error": str(err)}
    sample.update(host=host_to_agent(body.get("host"), view), ms=round((time.monotonic() - t0) * 1000, 1))
    try:
        seen = exec_ok(client, body["id"], f"cat {MARKER_PATH}").json()["stdout"].strip()
        sample["ok"] = seen == token
        if not sample["ok"]:
            sample["error"] = f"marker {seen!r} != {token!r}"
    except (CryoboxError, httpx.HTTPError) as err:
        sample["error"] = str(err)
    finally:
        client.delete(f"/v1/sandboxes/{body['id']}")
    return sample


def measure_restores(fleet: Fleet, template: str, m: int, kill_source: bool, store_timeout_s: float) -> dict[str, Any]:
    """``m`` snapshots of one sandbox (each with its own marker), each waited until ``stored``; ``m`` restores of
    the first while every agent is up; then (``kill_source``) the source agent is SIGKILLed and each snapshot is
    restored once more: necessarily elsewhere, most of them on a host that never held them."""
    headers = {"Authorization": f"Bearer {fleet.api_key}"}
    with httpx.Client(base_url=fleet.url, headers=headers, timeout=900, trust_env=False) as client:
        view = fleet.agents_view()
        source = checked(client.post("/v1/sandboxes", json={"template": template, "ttl_seconds": 1800}), "create")
        source_host = host_to_agent(source.get("host"), view)
        snapshots: list[tuple[int, str, str]] = []
        store_waits = []
        for index in range(m):
            token = secrets.token_hex(8)
            exec_ok(client, source["id"], f"echo {token} > {MARKER_PATH} && sync")
            body = {"retain": True, "labels": {"bench": "fleet"}}  # retain: outlives its sandbox (and its host)
            snapshot = checked(client.post(f"/v1/sandboxes/{source['id']}/snapshots", json=body), "snapshot")
            store_waits.append(_wait_stored(client, snapshot["id"], store_timeout_s)[0])
            snapshots.append((index, str(snapshot["id"]), token))
        samples = [_restore_once(client, snapshots[0], view, "all-up") for _ in range(m)]
        killed = False
        if kill_source and source_host in fleet.agents and len(fleet.agents) > 1:
            fleet.kill_agent(source_host)
            fleet.wait_agent_not_up(source_host, timeout_s=fleet.agent_deadline_s * 6 + 30)
            killed = True
            samples += [_restore_once(client, snapshot, view, "source-killed") for snapshot in snapshots]
        else:
            client.delete(f"/v1/sandboxes/{source['id']}")
        deleted = [client.delete(f"/v1/snapshots/{snapshot_id}").status_code < 300 for _, snapshot_id, _ in snapshots]
    summary = restore_summary(samples, source_host)
    summary.update(
        snapshot_ids=[snapshot_id for _, snapshot_id, _ in snapshots],
        store_wait_p50_ms=quantile(store_waits, 50),
        source_killed=killed,
        snapshots_deleted=all(deleted),
    )
    return summary


# -- the run ---------------------------------------------------------------------------------------------------------


def run_fleet_bench(
    *,
    n: int = 48,
    agents: int = 3,
    k: int = 10,
    restores: int = 3,
    template: str = "base",
    prespawn: int = 1,
    settle_s: float = HOP_SETTLE_S,
    isolation: Literal["netns", "loopback"] = "netns",
    kill_source: bool = True,
    out_dir: Path,
    cache_dir: Path | None,
    plot: Path | None,
    console: Console,
    progress: Reporter,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="cryobox-fleet-", dir="/var/tmp"))
    stages = progress.phase("stages: hop (serve and fleet, interleaved), burst, restores", 4)
    try:
        console.print(
            f"[bold]hop[/bold]: {k} creates and {k} execs each, taking turns, against cryobox serve (in-process "
            f"agent) and a fleet of one agent ({isolation})"
        )
        serve_args = ["--templates", template, "--memory", "hot", "--net-pool", "4"]
        one = Fleet(
            root / "hop",
            agents=1,
            cache_dir=cache_dir,
            isolation=isolation,
            template_source="build",
            memory="hot",
            templates=(template,),
            prespawn=prespawn,
            net_pool=4,
        )
        with one:
            # serve's registry in the fleet's PostgreSQL (a database of its own): the sides differ by the hop alone,
            # not by SQLite against PostgreSQL on every registry read of the path as well
            assert one.postgres is not None
            serve_db = {"CRYOBOX_DATABASE_URL": one.postgres.create_database("serve")}
            serve = ServeProcess(
                root / "serve", cache_dir=cache_dir, prespawn=prespawn, extra_args=serve_args, extra_env=serve_db
            )
            with serve:
                sides = [Side("inproc", serve.url, serve.api_key), Side("http", one.url, one.api_key)]
                samples = measure_hop(sides, template, k, settle_s)
        inproc, http = by_side(samples, "inproc"), by_side(samples, "http")
        stages.advance(2)
        hop = {**hop_summary(inproc, http), "registry": "postgresql, both sides"}
        per_agent = math.ceil(n / agents)
        admission = {"CRYOBOX_ADMISSION_QUEUE": str(max(64, n)), "CRYOBOX_ADMISSION_TIMEOUT_S": "900"}
        console.print(f"[bold]burst[/bold]: {n} creates at once over {agents} agents (lazy memory from S3)")
        fleet = Fleet(
            root / "burst",
            agents=agents,
            cache_dir=cache_dir,
            isolation=isolation,
            template_source="store",
            memory="lazy",
            templates=(template,),
            prespawn=0,
            net_pool=min(per_agent + 2, 64),
            max_sandboxes=n + 4,
            agent_env=admission,
        )
        with fleet:
            burst = measure_burst(fleet, template, n)
            stages.advance()
            console.print(f"[bold]restore[/bold]: snapshot on one agent, {restores} restores, then its host killed")
            restore = measure_restores(fleet, template, restores, kill_source, store_timeout_s=600)
            stages.advance()
        stages.finish()
    except BaseException:
        console.print(f"[red]fleet bench failed[/red]; logs kept in {keep_logs(root)}")
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = assemble(hop, burst, restore, template=template, isolation=isolation, agents=agents)
    path = write_result(out_dir, "fleet", result)
    _print(result, console)
    console.print(f"wrote {path}")
    if plot is not None:
        draw(result, plot)
        console.print(f"plot {plot}")
    return result


def keep_logs(root: Path) -> Path:
    """Copy every ``*.log`` under ``root`` (the run's data dirs are removed) to a directory that stays."""
    kept = Path(tempfile.mkdtemp(prefix="cryobox-fleet-logs-", dir="/var/tmp"))
    for log in root.rglob("*.log"):
        if log.is_file():
            target = kept / log.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, target)
    return kept


def _print(result: Mapping[str, Any], console: Console) -> None:
    hop = result["hop"]
    table = Table(title=f"HTTP hop ({hop['k']} samples each, interleaved)")
    for column in ("", "in-process p50", "in-process p99", "HTTP p50", "HTTP p99", "hop p50", "p-value"):
        table.add_column(column, justify="right")
    for op in HOP_OPS:
        keys = (f"{op}_p50_ms_inproc", f"{op}_p99_ms_inproc", f"{op}_p50_ms_http", f"{op}_p99_ms_http")
        table.add_row(op, *(str(hop[key]) for key in keys), str(hop[f"{op}_hop_p50_ms"]), str(hop[f"{op}_hop_p_value"]))
    console.print(table)
    burst = result["burst"]
    table = Table(title=f"burst of {burst['n']} (p50 {burst['p50_ms']} ms, p99 {burst['p99_ms']} ms)")
    for column in ("agent", "sandboxes", "store GETs", "unique chunks"):
        table.add_column(column, justify="right")
    for name, count in burst["per_agent"].items():
        gets, chunks = burst["store_gets_per_agent"].get(name), burst["unique_chunks_per_agent"].get(name)
        table.add_row(name, str(count), str(gets), str(chunks))
    console.print(table)
    restore = result["restore"]
    console.print(
        f"restores: same-host p50 {result['same_host_restore_p50_ms']} ms (n={restore['same_host']}), cross-host "
        f"p50 {result['cross_host_restore_p50_ms']} ms (n={restore['cross_host']}), repeat p50 "
        f"{restore['cross_host_repeat_p50_ms']} ms (n={restore['cross_host_repeat']}); "
        f"cross-host ok {result['cross_host_restore_ok']}"
    )


def draw(result: Mapping[str, Any], out: Path) -> None:
    """Hop latencies, the burst's latency CDF, per-agent load and store traffic, restore latencies by kind."""
    try:
        import matplotlib
    except ImportError:
        raise CryoboxError("--plot needs matplotlib (pip install matplotlib; `make setup` installs it)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((hop_ax, cdf_ax), (agent_ax, restore_ax)) = plt.subplots(2, 2, figsize=(12, 8.5))
    hop = result["hop"]
    ops = ["create", "first_exec", "exec"]
    width = 0.2
    for j, (side, q) in enumerate((("inproc", 50), ("inproc", 99), ("http", 50), ("http", 99))):
        values = [hop.get(f"{op}_p{q}_ms_{side}") or 0 for op in ops]
        hop_ax.bar([i + (j - 1.5) * width for i in range(len(ops))], values, width, label=f"{side} p{q}")
    hop_ax.set_xticks(range(len(ops)), ops)
    hop_ax.set_ylabel("ms")
    hop_ax.set_yscale("log")
    hop_ax.set_title("in-process agent vs HTTP agent")
    hop_ax.legend(fontsize=8)
    burst = result["burst"]
    xs = burst["latencies_ms"]
    if xs:
        cdf_ax.step([xs[0], *xs], [0.0, *((i + 1) / len(xs) for i in range(len(xs)))], where="post")
    cdf_ax.set_xlabel("create latency (ms)")
    cdf_ax.set_ylabel("fraction of creates")
    cdf_ax.set_title(f"{burst['n']} simultaneous creates over {burst.get('agents', '?')} agents")
    names = list(burst["per_agent"])
    series = (("sandboxes", "per_agent"), ("store GETs", "store_gets_per_agent"), ("chunks", "unique_chunks_per_agent"))
    for j, (label, key) in enumerate(series):
        values = [burst[key].get(name) or 0 for name in names]
        agent_ax.bar([i + (j - 1) * 0.27 for i in range(len(names))], values, 0.27, label=label)
    agent_ax.set_xticks(range(len(names)), names)
    agent_ax.set_title("per agent: placement and store traffic")
    agent_ax.legend(fontsize=8)
    samples = result.get("restore", {}).get("samples", [])
    kinds = (("same-host", "tab:green"), ("cross-host", "tab:orange"), ("cross-host-repeat", "tab:purple"))
    for kind, colour in kinds:
        chosen = [(i, s["ms"]) for i, s in enumerate(samples) if s.get("kind") == kind]
        if chosen:
            restore_ax.scatter([c[0] for c in chosen], [c[1] for c in chosen], label=kind, color=colour)
    killed_at = next((i for i, s in enumerate(samples) if s.get("phase") == "source-killed"), None)
    if killed_at is not None:
        restore_ax.axvline(killed_at - 0.5, color="grey", linestyle="--", label="source host killed")
    restore_ax.set_title("snapshot restores: same-host vs cross-host")
    if samples:
        restore_ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
