"""``cryobox agent`` (a host agent over HTTP) and ``cryobox control`` (the control plane alone).

Run one control plane (or several replicas) on PostgreSQL and an S3-compatible store, and one agent per host::

    CRYOBOX_DATABASE_URL=postgresql://... CRYOBOX_NODE_TOKEN=T cryobox control --listen 0.0.0.0:8080 --store s3://...
    CRYOBOX_NODE_TOKEN=T cryobox agent --listen 10.0.0.5:9090 --control http://ctl:8080 --data-dir /srv/cryobox \\
        --store s3://... --template-source store

Under systemd (``packaging/systemd/``, ``docs/deploy.md``) both take their listening socket from a ``.socket`` unit
(:mod:`cryobox.compose.activation`): restarts and upgrades refuse no connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from .frontdoor import SandboxDomain, TlsCert, TlsKey, front_door

if TYPE_CHECKING:
    import uvicorn

    from ..compose.activation import Activation
    from ..compose.listeners import TlsListener

console = Console(stderr=True)


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter(f"--listen must be HOST:PORT, not {listen!r}")
    return host, int(port)


def _token() -> str:
    from ..compose.parts import NODE_TOKEN_ENV

    token = os.environ.get(NODE_TOKEN_ENV, "")
    if not token:
        raise typer.BadParameter(f"{NODE_TOKEN_ENV} must be set (the secret agents and the control plane share)")
    return token


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _run_until_signalled(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` until SIGTERM or SIGINT (a clean exit); a :class:`CryoboxError` from it exits 2."""
    import asyncio

    from ..errors import CryoboxError

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    try:
        asyncio.run(main())
    except SystemExit as stop:  # a signal: main's cleanup has run (asyncio.run cancelled it)
        if stop.code not in (0, None):
            raise
    except CryoboxError as error:
        console.print(f"[red]cannot start[/red] ({error.code}): {error.message}")
        raise typer.Exit(2) from error


async def _serve_notifying(server: uvicorn.Server, tls: TlsListener | None, activation: Activation) -> None:
    """Serve (:func:`..compose.listeners.serve`), telling systemd (``Type=notify``) when it serves and stops; the
    garbage collector paused since the start (:mod:`..compose.gcpause`) collects again once it serves."""
    import asyncio

    from ..compose import gcpause
    from ..compose.listeners import serve
    from ..compose.sdnotify import readiness

    releasing = asyncio.create_task(gcpause.release_once_serving(server), name="collect once serving")
    try:
        async with readiness(server):
            await serve(server, tls, activation)
    finally:
        releasing.cancel()


def _activation() -> Activation:
    """The listening sockets a supervisor passed (systemd socket activation); a malformed hand-over is a usage
    error."""
    from ..compose.activation import take_activation
    from ..errors import CryoboxError

    try:
        return take_activation()
    except CryoboxError as err:
        raise typer.BadParameter(err.message) from None


def _log_to_stderr() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def agent(
    ctx: typer.Context,
    listen: Annotated[str | None, typer.Option(help="HOST:PORT the agent serves the agent interface on")] = None,
    control: Annotated[str | None, typer.Option(help="the control plane's URL (heartbeats go there)")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="this agent's state")] = None,
    cache_dir: Annotated[
        Path | None, typer.Option("--cache-dir", help="image cache (default /var/cache/cryobox)")
    ] = None,
    name: Annotated[str | None, typer.Option(help="agent name (default: the host name)")] = None,
    advertise: Annotated[str | None, typer.Option(help="URL the control plane uses (default http://LISTEN)")] = None,
    store: Annotated[str | None, typer.Option(envvar="CRYOBOX_STORE_URL", help="object store URL")] = None,
    template_source: Annotated[str, typer.Option(help="'build' (bake here) or 'store' (fetch published)")] = "build",
    templates: Annotated[str | None, typer.Option(help="built-in templates to serve, comma-separated")] = None,
    prespawn: Annotated[int, typer.Option(help="prepared QEMUs kept per template")] = 2,
    net_pool: Annotated[int, typer.Option(envvar="CRYOBOX_NET_POOL", help="network slots kept pre-built")] = 16,
    memory: Annotated[str, typer.Option(help="'hot' or 'lazy' restores")] = "hot",
    memory_mib: Annotated[int | None, typer.Option(help="memory this agent offers (default: the host's)")] = None,
    vcpus: Annotated[int | None, typer.Option(help="vCPUs this agent offers (default: the host's)")] = None,
    max_sandboxes: Annotated[int, typer.Option(min=1, help="sandboxes this agent may run")] = 256,
    heartbeat_interval: Annotated[float, typer.Option(help="seconds between heartbeats")] = 2.0,
    max_concurrent_restores: Annotated[int | None, typer.Option(help="restores at once (default 4)")] = None,
    admission_queue: Annotated[int | None, typer.Option(help="creates that may wait (default 64)")] = None,
    admission_timeout: Annotated[float | None, typer.Option(help="seconds a create may wait (default 30)")] = None,
    chunk_cache_bytes: Annotated[int, typer.Option(help="chunk cache budget")] = 8 << 30,
    store_faults: Annotated[str, typer.Option(envvar="CRYOBOX_STORE_FAULTS", help="store fault injection")] = "",
    on_stop: Annotated[
        str | None,
        typer.Option(envvar="CRYOBOX_ON_STOP", help="on SIGTERM: 'keep' VMs running (default), 'hibernate', 'kill'"),
    ] = None,
) -> None:
    """Run a host agent (--listen, --control and --data-dir): it owns this host's VMs and serves the control plane
    over HTTP (node token). With a subcommand (drain, undrain): act on an agent through the control plane's API."""
    if ctx.invoked_subcommand is not None:
        return
    if listen is None or control is None or data_dir is None:
        raise typer.BadParameter("--listen, --control and --data-dir are required to run an agent")
    import asyncio

    from ..agent.host.startup import HostConfig
    from ..agent.memory.settings import MemoryMode, StorageConfig, TemplateSource
    from ..agent.sandbox.admission import AdmissionConfig
    from ..agent.sandbox.pool import PoolMode
    from ..agentapi import create_agent_app
    from ..agentapi.heartbeat import HeartbeatSender
    from ..compose import gcpause
    from ..compose.listeners import http_server
    from ..compose.parts import AgentOptions, boot_agent, on_stop_mode
    from ..config import Paths
    from ..errors import CryoboxError
    from .templates_opt import parse_templates

    activation = _activation()
    token = _token()
    host, port = _split(listen)
    agent_name = name or socket.gethostname()
    url = advertise or f"http://{host}:{port}"
    try:
        storage = StorageConfig(
            store_url=store,
            memory_mode=MemoryMode(memory),
            template_source=TemplateSource(template_source),
            chunk_cache_bytes=chunk_cache_bytes,
            store_faults=store_faults,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    paths = Paths.from_env(data_dir, cache_dir)
    config = HostConfig(
        paths=paths,
        prespawn=prespawn,
        pool_mode=PoolMode.WARM,
        net_pool=net_pool,
        storage=storage,
        templates=parse_templates(templates),
    )
    admission_config = AdmissionConfig.from_env(
        max_concurrent=max_concurrent_restores, queue_length=admission_queue, timeout_s=admission_timeout
    )
    try:
        stop_mode = on_stop_mode(on_stop)
    except CryoboxError as err:
        raise typer.BadParameter(err.message) from None
    _log_to_stderr()
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        gcpause.hold(asyncio.get_running_loop())  # until it serves (compose/gcpause.py)
        options = AgentOptions(
            name=agent_name, url=url, memory_mib=memory_mib, vcpus=vcpus, max_sandboxes=max_sandboxes
        )
        booted, hostagent = await boot_agent(config, admission_config, options, console.print)
        sender = HeartbeatSender(hostagent, control, token, interval_s=heartbeat_interval)
        beating = asyncio.create_task(sender.run(), name="heartbeats")
        console.print(f"agent {agent_name} serving {url}, reporting to {control}")
        try:
            await _serve_notifying(http_server(create_agent_app(hostagent, token), host, port), None, activation)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            await sender.aclose()
            await booted.close(stop_mode)

    _run_until_signalled(main)
    from ..compose.processexit import exit_now

    exit_now()


def control(
    listen: Annotated[str, typer.Option(help="HOST:PORT of the public API")] = "127.0.0.1:8080",
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="state (SQLite unless CRYOBOX_DATABASE_URL)")
    ] = None,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="default store location")] = None,
    store: Annotated[str | None, typer.Option(envvar="CRYOBOX_STORE_URL", help="object store URL")] = None,
    agent_deadline: Annotated[float | None, typer.Option(help="seconds of missed heartbeats before 'down'")] = None,
    reap_interval: Annotated[float, typer.Option(help="seconds between TTL reaper sweeps")] = 5.0,
    snapshot_grace: Annotated[float | None, typer.Option(help="seconds an orphaned snapshot is kept")] = None,
    orphan_sweep_interval: Annotated[float | None, typer.Option(help="seconds between orphan sweeps")] = None,
    paused_retention: Annotated[
        str | None, typer.Option(help="how long a hibernated sandbox is kept: 3600, 90m, 12h, 30d (default 30d)")
    ] = None,
    sandbox_domain: SandboxDomain = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    https_listen: Annotated[
        str | None,
        typer.Option(envvar="CRYOBOX_HTTPS_LISTEN", help="HOST:PORT of the HTTPS listener (default: HOST:443)"),
    ] = None,
) -> None:
    """Run the control plane alone: the public API, placement and the registry; agents register with it."""
    import asyncio

    from ..compose.app import Intervals, create_app
    from ..compose.listeners import HTTPS_PORT, http_server
    from ..compose.parts import build_control, fleet_config
    from ..config import Paths
    from ..objstore.client import open_store
    from ..registry import Registry
    from ..server.access.apikey import load_or_create_key
    from ..server.access.ratelimit import RateLimitConfig, RateLimiter
    from ..server.control.snapshots import RetentionPolicy
    from ..server.metrics import Metrics
    from ._common import parse_duration

    activation = _activation()
    _token()
    host, port = _split(listen)
    https_host, https_port = _split(https_listen) if https_listen else (host, HTTPS_PORT)
    domain, tls = front_door(sandbox_domain, tls_cert, tls_key, https_host, https_port)
    paths = Paths.from_env(data_dir, cache_dir)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    paused_s = parse_duration(paused_retention) if paused_retention is not None else None
    retention = RetentionPolicy.from_env(snapshot_grace, orphan_sweep_interval, paused_s=paused_s)
    limiter = RateLimiter.from_config(RateLimitConfig.from_env())
    registry = Registry.for_data_dir(paths.data_dir)
    _log_to_stderr()

    async def main() -> None:
        await asyncio.to_thread(registry.migrate)
        workspace = await asyncio.to_thread(registry.ensure_workspace, "default")
        key, _ = load_or_create_key(paths.data_dir)
        await asyncio.to_thread(registry.import_key, workspace.id, key, "bootstrap")
        objects = await asyncio.to_thread(open_store, store or paths.default_store_url)
        control_plane = build_control(registry, fleet_config(deadline_s=agent_deadline), retention, objects, Metrics())
        app = create_app(
            control_plane,
            limiter=limiter,
            host=socket.gethostname(),
            intervals=Intervals(reap_s=reap_interval),
            sandbox_domain=domain,
        )
        console.print(f"control plane on http://{host}:{port}, registry {registry.url}, store {objects.url}")
        console.print(f"export CRYOBOX_API_URL=http://{host}:{port} CRYOBOX_API_KEY={key}", soft_wrap=True)
        if tls is not None:
            console.print(f"HTTPS on https://{tls.host}:{tls.port} ({tls.cert})", soft_wrap=True)
        if domain is not None:
            console.print(f"sandbox hosts {{port}}-{{sandbox_id}}.{domain}", soft_wrap=True)
        console.print(f"web console: http://{host}:{port}/ui", soft_wrap=True)
        await _serve_notifying(http_server(app, host, port), tls, activation)

    try:
        _run_until_signalled(main)
    finally:
        registry.close()
    from ..compose.processexit import exit_now

    exit_now()
