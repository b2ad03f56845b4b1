"""Entry point of the ``cryobox`` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ._common import CacheDir, parse_duration
from .agent_cmds import agent_app
from .bench_cmds import bench_app
from .capture_cmds import capture
from .debug_cmds import bisect, debug
from .fleet_cmds import control as control_cmd
from .frontdoor import SandboxDomain, TlsCert, TlsKey, front_door
from .gc_cmd import gc
from .inspect_cmds import inspect_app
from .keys_cmds import keys_app
from .lifecycle_cmds import lifecycle as sandbox_lifecycle
from .mcp_cmd import mcp
from .network_cmds import egress as sandbox_egress
from .network_cmds import network as sandbox_network
from .observe_cmds import logs as sandbox_logs
from .observe_cmds import metrics as sandbox_metrics
from .sandbox_cmds import sandbox_app, template_app
from .snapshot_cmds import snapshot_app
from .template_build import template_build
from .template_cmds import template_create
from .top_cmd import top
from .volume_cmds import volume_app

app = typer.Typer(help="cryobox: microVM sandboxes where every create is a snapshot restore.", no_args_is_help=True)
image_app = typer.Typer(help="Guest images and templates.", no_args_is_help=True)
app.add_typer(image_app, name="image")
app.add_typer(sandbox_app, name="sandbox")
sandbox_app.command("network")(sandbox_network)
sandbox_app.command("egress")(sandbox_egress)
sandbox_app.command("lifecycle")(sandbox_lifecycle)
sandbox_app.command("metrics")(sandbox_metrics)
sandbox_app.command("logs")(sandbox_logs)
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(volume_app, name="volume")
app.add_typer(template_app, name="template")
template_app.command("create")(template_create)
template_app.command("build")(template_build)
app.add_typer(keys_app, name="keys")
app.add_typer(inspect_app, name="inspect")
app.add_typer(bench_app, name="bench")
app.command("capture")(capture)
app.command("debug")(debug)
app.command("bisect")(bisect)
app.add_typer(agent_app, name="agent")
app.command("control")(control_cmd)
app.command("gc")(gc)
app.command("mcp")(mcp)
app.command("top")(top)
console = Console(stderr=True)

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="platform state (default /var/lib/cryobox)")]


@app.command()
def serve(
    data_dir: DataDir = None,
    cache_dir: CacheDir = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    prespawn: Annotated[int, typer.Option(help="prepared QEMUs kept per template (0: none)")] = 2,
    pool_mode: Annotated[
        str,
        typer.Option(envvar="CRYOBOX_POOL_MODE", help="'warm' (state loaded, first exec done, paused) or 'spawned'"),
    ] = "warm",
    max_concurrent_restores: Annotated[
        int | None, typer.Option(help="restores running at once (env CRYOBOX_MAX_CONCURRENT_RESTORES, default 4)")
    ] = None,
    admission_queue: Annotated[
        int | None, typer.Option(help="creates that may wait for a slot (env CRYOBOX_ADMISSION_QUEUE, default 64)")
    ] = None,
    admission_timeout: Annotated[
        float | None, typer.Option(help="seconds a create may wait (env CRYOBOX_ADMISSION_TIMEOUT_S, default 30)")
    ] = None,
    reap_interval: Annotated[float, typer.Option(help="seconds between TTL reaper sweeps")] = 5.0,
    net_pool: Annotated[
        int, typer.Option(envvar="CRYOBOX_NET_POOL", help="network slots kept pre-built (slot CIDR: CRYOBOX_NET_CIDR)")
    ] = 16,
    snapshot_grace: Annotated[
        float | None,
        typer.Option(help="seconds an orphaned snapshot is kept (env CRYOBOX_SNAPSHOT_GRACE_S, default 7 days)"),
    ] = None,
    orphan_sweep_interval: Annotated[
        float | None,
        typer.Option(help="seconds between orphan sweeps (env CRYOBOX_ORPHAN_SWEEP_INTERVAL_S, default 900)"),
    ] = None,
    paused_retention: Annotated[
        str | None,
        typer.Option(
            help="how long a hibernated (paused) sandbox is kept before it is deleted: 3600, 90m, 12h, 30d "
            "(env CRYOBOX_PAUSED_RETENTION_S, default 30d)"
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            envvar="CRYOBOX_STORE_URL",
            help="object store: file:///dir or s3://bucket?endpoint=URL&region=R (default file://<cache>/store)",
        ),
    ] = None,
    memory: Annotated[
        str,
        typer.Option(
            envvar="CRYOBOX_MEMORY", help="'hot' (tmpfs copy of local images) or 'lazy' (page RAM from the store)"
        ),
    ] = "hot",
    template_source: Annotated[
        str,
        typer.Option(
            envvar="CRYOBOX_TEMPLATE_SOURCE", help="'build' (bake here, publish) or 'store' (fetch published)"
        ),
    ] = "build",
    chunk_cache_bytes: Annotated[
        int, typer.Option(envvar="CRYOBOX_CHUNK_CACHE_BYTES", help="chunk cache budget in allocated bytes")
    ] = 8 << 30,
    store_faults: Annotated[
        str,
        typer.Option(
            envvar="CRYOBOX_STORE_FAULTS",
            help="inject store latency/throttling, e.g. latency_ms=20,bandwidth_mbps=400,throttle_rate=0.05",
        ),
    ] = "",
    naive_memory: Annotated[
        bool, typer.Option(help="memory server without single-flight and chunk cache (benchmark baseline)")
    ] = False,
    fetch_deadline: Annotated[
        float | None, typer.Option(help="seconds one chunk fetch may take, retries included (default 15)")
    ] = None,
    prefetch: Annotated[
        bool, typer.Option(help="replay an image's recorded chunk order on its first lazy restore")
    ] = True,
    templates: Annotated[
        str | None,
        typer.Option(
            envvar="CRYOBOX_TEMPLATES",
            help="built-in templates to serve, comma-separated, of base, code-interpreter, docker "
            "(default: base,code-interpreter)",
        ),
    ] = None,
    max_sandboxes: Annotated[
        int, typer.Option(envvar="CRYOBOX_MAX_SANDBOXES", min=1, help="sandboxes this host may run (placement)")
    ] = 256,
    on_stop: Annotated[
        str | None,
        typer.Option(
            envvar="CRYOBOX_ON_STOP",
            help="on SIGTERM: 'keep' sandboxes running for the next start (default), 'hibernate' them, or 'kill'",
        ),
    ] = None,
    memory_mib: Annotated[
        int | None, typer.Option(min=1, help="memory this host offers to placement, MiB (default: the host's)")
    ] = None,
    sandbox_domain: SandboxDomain = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    https_port: Annotated[
        int, typer.Option(envvar="CRYOBOX_HTTPS_PORT", help="port of the HTTPS listener (with --tls-cert), on --host")
    ] = 443,
) -> None:
    """Start the platform: build images and templates if needed, then serve the HTTP API."""
    from ..agent.memory.settings import MemoryMode, StorageConfig, TemplateSource
    from ..agent.sandbox.pool import PoolMode
    from ..errors import CryoboxError
    from ..objstore.faults import StoreFaults
    from .serve import ServeOptions
    from .serve import serve as run_serve

    try:
        mode = PoolMode(pool_mode)
    except ValueError:
        raise typer.BadParameter(f"--pool-mode must be 'warm' or 'spawned', not {pool_mode!r}") from None
    try:
        memory_mode = MemoryMode(memory)
    except ValueError:
        raise typer.BadParameter(f"--memory must be 'hot' or 'lazy', not {memory!r}") from None
    try:
        source = TemplateSource(template_source)
    except ValueError:
        raise typer.BadParameter(f"--template-source must be 'build' or 'store', not {template_source!r}") from None
    if store_faults:
        try:
            StoreFaults.parse(store_faults)
        except CryoboxError as err:
            raise typer.BadParameter(f"--store-faults: {err.message}") from None
    from .templates_opt import parse_templates

    specs = parse_templates(templates)
    domain, tls = front_door(sandbox_domain, tls_cert, tls_key, host, https_port)
    options = ServeOptions(
        data_dir=data_dir,
        cache_dir=cache_dir,
        host=host,
        port=port,
        prespawn=prespawn,
        pool_mode=mode,
        max_concurrent_restores=max_concurrent_restores,
        admission_queue=admission_queue,
        admission_timeout_s=admission_timeout,
        reap_interval_s=reap_interval,
        net_pool=net_pool,
        snapshot_grace_s=snapshot_grace,
        orphan_sweep_interval_s=orphan_sweep_interval,
        paused_retention_s=parse_duration(paused_retention) if paused_retention is not None else None,
        storage=StorageConfig(
            store_url=store,
            memory_mode=memory_mode,
            template_source=source,
            chunk_cache_bytes=chunk_cache_bytes,
            store_faults=store_faults,
            naive_memory=naive_memory,
            fetch_deadline_s=fetch_deadline,
            prefetch=prefetch,
        ),
        templates=specs,
        max_sandboxes=max_sandboxes,
        on_stop=on_stop,
        memory_mib=memory_mib,
        sandbox_domain=domain,
        tls=tls,
    )
    try:
        run_serve(options, console)
    except CryoboxError as error:
        console.print(f"[red]cannot start[/red] ({error.code}): {error.message}")
        raise typer.Exit(2) from error


@image_app.command("build")
def image_build(data_dir: DataDir = None, cache_dir: CacheDir = None) -> None:
    """Build the guest images and bake the default templates (cached: a second run rebuilds nothing)."""
    import asyncio

    from ..agent.host.startup import HostConfig, prepare_templates
    from ..config import Paths
    from ..util.progress import RoutedReporter, open_reporter

    config = HostConfig(paths=Paths.from_env(data_dir, cache_dir))
    with open_reporter(console) as reporter, reporter.phase("building images and templates") as building:

        def progress(line: str) -> None:
            if line.startswith("debootstrap: "):
                building.update(line[:100])
            else:
                reporter(line)

        templates = asyncio.run(prepare_templates(config, RoutedReporter(reporter, progress)))
    for name, template in templates.items():
        console.print(f"{name}: {template.generation} {template.path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
