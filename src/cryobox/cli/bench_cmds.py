"""``cryobox bench ...``: each benchmark prints its figures on stderr, reports its phases there (bars on a
terminal, plain lines otherwise or with ``--json``), writes its JSON under ``--out-dir`` and, with ``--json``,
prints it on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..util.progress import open_reporter
from ._common import CacheDir

bench_app = typer.Typer(help="Benchmarks (print figures, write JSON under bench/results/).", no_args_is_help=True)
console = Console(stderr=True)

# the options every benchmark takes
AsJson = Annotated[bool, typer.Option("--json", help="print the JSON result")]
OutDir = Annotated[Path, typer.Option(help="where to write the JSON")]
RESULTS_DIR = Path("bench/results")


def _print_result(result: object, as_json: bool) -> None:
    """A benchmark's result on stdout, with ``--json`` (it is written under ``--out-dir`` either way)."""
    if as_json:
        print(json.dumps(result, indent=2))


@bench_app.command("create")
def bench_create(
    n: Annotated[int, typer.Option("--n", help="samples per measurement")] = 20,
    template: Annotated[str, typer.Option(help="template to measure")] = "base",
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Cold boot vs bare restore vs API create, each to the first exec answered, in one run."""
    import asyncio

    from ..bench.create import run_create_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = asyncio.run(
            run_create_bench(
                n=n, template=template, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress
            )
        )
    _print_result(result, as_json)


@bench_app.command("build")
def bench_build(
    n: Annotated[int, typer.Option("--n", help="creates per template measured")] = 10,
    apt: Annotated[
        str, typer.Option("--apt", help="a Debian package the heavy step installs (needs the archive)")
    ] = "",
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """First build vs cached rebuild of a Dockerfile, creates from it vs from base, a busybox-only image."""
    from ..bench.build import run_build_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_build_bench(n=n, apt=apt, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress)
    _print_result(result, as_json)


@bench_app.command("snapshot")
def bench_snapshot(
    n: Annotated[int, typer.Option("--n", help="samples per pause-window measurement (restores: at least 10)")] = 5,
    qemu: Annotated[
        list[str] | None,
        typer.Option(
            "--qemu",
            help="another qemu-system-x86_64 to measure too, side by side (repeatable; the top-level keys "
            "describe the default binary: CRYOBOX_QEMU or the system's)",
        ),
    ] = None,
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Snapshot pause window (512 MiB vs 2 GiB), restore, fork-tree of 16 and their Pss, dirty sweep, hot-dir
    bytes, lazy pause; for each QEMU binary, in one run."""
    from ..bench.snapshot import run_snapshot_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_snapshot_bench(
            n=n, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress, qemus=qemu or []
        )
    _print_result(result, as_json)


@bench_app.command("code")
def bench_code(
    n: Annotated[int, typer.Option("--n", help="fresh sandboxes per first-call measurement")] = 5,
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """First run_code and first DataFrame after a create vs `python3 -c "import pandas"`, and steady run_code."""
    from ..bench.code import run_code_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_code_bench(n=n, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress)
    _print_result(result, as_json)


@bench_app.command("docker")
def bench_docker(
    n: Annotated[int, typer.Option("--n", min=1, help="creates per measurement")] = 10,
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Docker inside: create → first `docker ps`, create → `docker run` of a hello image, and the template's size."""
    from ..bench.docker import run_docker_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_docker_bench(n=n, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress)
    _print_result(result, as_json)


@bench_app.command("resume")
def bench_resume(
    n: Annotated[int, typer.Option("--n", min=1, help="hibernate/resume rounds")] = 20,
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """A paused (hibernated) sandbox's first command: explicit resume + command, auto-wake command, running."""
    from ..bench.resume import run_resume_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_resume_bench(n=n, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress)
    _print_result(result, as_json)


@bench_app.command("volume")
def bench_volume(
    n: Annotated[int, typer.Option("--n", min=1, help="creates per variant")] = 20,
    io_runs: Annotated[
        int, typer.Option("--io-runs", min=0, help="in-guest I/O runs on volume and root (0: none)")
    ] = 3,
    upload: Annotated[bool, typer.Option("--upload/--no-upload", help="detach-upload of 1 GiB, 10 % changed")] = True,
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """What attaching volumes adds to a create (none, one read-write, one read-only, both), to the first exec;
    then sequential and 4 KiB random I/O in the guest on a volume against the root disk."""
    import asyncio
    import tempfile

    from ..bench.volume import measure
    from ..config import Paths

    paths = Paths.from_env(None, cache_dir)
    with tempfile.TemporaryDirectory(prefix="cryobox-bench-volume-") as tmp:
        data = Path(tmp) / "data"
        result = asyncio.run(
            measure(data, paths.cache_dir, out_dir, n, progress=console.print, io_runs=io_runs, upload=upload)
        )
    console.print(f"added to a create (p50): {result.get('added_ms')}")
    if result.get("io"):
        console.print(f"volume / root disk in the guest: {result['io']['ratio_volume_to_root']}")
    if result.get("detach_upload"):
        console.print(f"detach-upload, 1 GiB with 10 % changed: {result['detach_upload']}")
    _print_result(result, as_json)


@bench_app.command("net")
def bench_net(
    n: Annotated[int, typer.Option("--n", help="creates per snapshot age for the clock error")] = 5,
    ages: Annotated[str, typer.Option("--ages", help="snapshot ages in seconds, comma-separated")] = "10,60",
    only: Annotated[
        str | None, typer.Option("--only", help="run one section alone: egress (the egress proxy's cost, no VM)")
    ] = None,
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Network slot acquire (warm vs cold pool), the egress proxy's cost against direct routing, guest clock error
    right after create, create latency, in one run."""
    from ..bench.net import run_net_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_net_bench(
            n=n, ages=ages, out_dir=out_dir, cache_dir=cache_dir, console=console, progress=progress, only=only
        )
    _print_result(result, as_json)


@bench_app.command("burst")
def bench_burst(
    n: Annotated[int, typer.Option("--n", help="creates fired at once")] = 32,
    template: Annotated[str, typer.Option(help="template to create")] = "base",
    faults: Annotated[
        str, typer.Option(help="store-side latency/bandwidth/throttle injection ('' for none)")
    ] = "latency_ms=30,bandwidth_mbps=800",
    concurrency: Annotated[int, typer.Option(help="--max-concurrent-restores of the measured servers")] = 4,
    as_json: AsJson = False,
    plot: Annotated[Path | None, typer.Option(help="write a PNG: latency CDFs, GETs vs chunks")] = None,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """N simultaneous creates with memory only in the object store: cold cache, warm cache, naive; one run."""
    from ..bench.burst import run_burst_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_burst_bench(
            n=n,
            template=template,
            faults=faults,
            concurrency=concurrency,
            out_dir=out_dir,
            cache_dir=cache_dir,
            plot=plot,
            console=console,
            progress=progress,
        )
    _print_result(result, as_json)


@bench_app.command("fleet")
def bench_fleet(
    n: Annotated[int, typer.Option("--n", help="creates fired at once in the burst")] = 48,
    agents: Annotated[int, typer.Option(help="agents of the burst/restore fleet")] = 3,
    k: Annotated[int, typer.Option("--k", help="sequential creates and execs per side of the hop comparison")] = 10,
    restores: Annotated[int, typer.Option(help="snapshot restores per phase (all agents up; source killed)")] = 3,
    template: Annotated[str, typer.Option(help="template to create")] = "base",
    isolation: Annotated[str, typer.Option(help="'netns' (an agent per network namespace) or 'loopback'")] = "netns",
    as_json: AsJson = False,
    plot: Annotated[Path | None, typer.Option(help="write a PNG: hop, burst CDF, per-agent load, restores")] = None,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Control plane + host agents: the HTTP hop's cost, a burst over N agents, same- vs cross-host restores."""
    from ..bench.fleet import run_fleet_bench

    if isolation not in ("netns", "loopback"):
        raise typer.BadParameter(f"--isolation must be 'netns' or 'loopback', not {isolation!r}")
    with open_reporter(console, as_json=as_json) as progress:
        result = run_fleet_bench(
            n=n,
            agents=agents,
            k=k,
            restores=restores,
            template=template,
            isolation="netns" if isolation == "netns" else "loopback",
            out_dir=out_dir,
            cache_dir=cache_dir,
            plot=plot,
            console=console,
            progress=progress,
        )
    _print_result(result, as_json)


@bench_app.command("restart")
def bench_restart(
    n: Annotated[int, typer.Option("--n", min=1, help="sandboxes that must survive every restart")] = 8,
    rounds: Annotated[
        int, typer.Option(min=1, help="restarts of each kind (SIGKILL, upgrade, SIGTERM) for the window")
    ] = 5,
    clients: Annotated[int, typer.Option(min=1, help="threads exec'ing `true` in a tight loop meanwhile")] = 2,
    vms: Annotated[int, typer.Option(min=1, help="running sandboxes for the SIGTERM-to-exit time")] = 50,
    memory_mib: Annotated[int, typer.Option(help="--memory-mib of that server (placement's host memory)")] = 65536,
    drain: Annotated[bool, typer.Option("--drain/--no-drain", help="the drain phase (a fleet of 2 agents)")] = True,
    drain_n: Annotated[int, typer.Option(min=1, help="sandboxes on the drained agent")] = 6,
    template: Annotated[str, typer.Option(help="template to create")] = "base",
    as_json: AsJson = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Agent restarts: sandboxes surviving SIGKILL/SIGTERM, the exec window, SIGTERM-to-exit with many VMs, drain."""
    from ..bench.restart import run_restart_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_restart_bench(
            n=n,
            rounds=rounds,
            clients=clients,
            vms=vms,
            memory_mib=memory_mib,
            drain=drain,
            drain_n=drain_n,
            template=template,
            out_dir=out_dir,
            cache_dir=cache_dir,
            console=console,
            progress=progress,
        )
    _print_result(result, as_json)
    if result["errors"]:
        raise typer.Exit(1)


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} takes comma-separated whole numbers, not {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{option} takes comma-separated numbers of at least 1, not {text!r}")
    return values


@bench_app.command("density")
def bench_density(
    samples: Annotated[int, typer.Option(min=1, help="create-to-first-exec samples per concurrency level")] = 100,
    levels: Annotated[str, typer.Option(help="concurrency levels, comma-separated")] = "1,4,8,16",
    pss_at: Annotated[str, typer.Option(help="idle-sandbox counts to read Pss at, comma-separated")] = "10,25,50",
    cap: Annotated[int, typer.Option(min=1, help="idle sandboxes at most, if admission never refuses")] = 200,
    snapshot_mib: Annotated[
        str, typer.Option(help="MiB dirtied before each snapshot, comma-separated")
    ] = "16,64,128,192",
    snapshot_reps: Annotated[int, typer.Option(min=1, help="snapshots per size")] = 5,
    memory_mib: Annotated[
        int | None, typer.Option(help="--memory-mib of the server (memory offered to placement; default the host's)")
    ] = None,
    as_json: AsJson = False,
    plot: Annotated[bool, typer.Option("--plot", help="write an SVG next to the JSON: latency, Pss per N")] = False,
    out_dir: OutDir = RESULTS_DIR,
    cache_dir: CacheDir = None,
) -> None:
    """Create-to-first-exec at concurrency 1/4/8/16, Pss per idle sandbox at N=10/25/50, idle sandboxes held
    until admission refuses, snapshot ms per 100 MiB dirtied, and the machine; one server, one run."""
    from ..bench.density import run_density_bench

    with open_reporter(console, as_json=as_json) as progress:
        result = run_density_bench(
            samples=samples,
            levels=_ints(levels, "--levels"),
            pss_at=_ints(pss_at, "--pss-at"),
            cap=cap,
            snapshot_mib=_ints(snapshot_mib, "--snapshot-mib"),
            snapshot_reps=snapshot_reps,
            memory_mib=memory_mib,
            plot=plot,
            out_dir=out_dir,
            cache_dir=cache_dir,
            console=console,
            progress=progress,
        )
    _print_result(result, as_json)
