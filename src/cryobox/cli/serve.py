"""``cryobox serve``: host agent + control plane in one process (embedded defaults: SQLite, local files)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rich.console import Console

from ..agent.host.ownership import wait_unlocked
from ..agent.host.prewarm import prewarm
from ..agent.host.startup import HostConfig
from ..agent.host.stopmode import OnStop
from ..agent.memory.settings import StorageConfig
from ..agent.sandbox.admission import AdmissionConfig
from ..agent.sandbox.pool import PoolMode
from ..agentapi import Agent, InProcessAgent
from ..compose import gcpause
from ..compose.activation import take_activation
from ..compose.app import Intervals, create_app
from ..compose.handover import announce_ready, bind_http, own_command, spawn_successor, take_handover
from ..compose.listeners import TlsListener, http_server
from ..compose.listeners import serve as serve_listeners
from ..compose.parts import AgentOptions, boot_agent, build_control, fleet_config, on_stop_mode
from ..compose.processexit import exit_now
from ..compose.sdnotify import notify, readiness
from ..compose.standby import SPAWNED_ENV, StandbyDesk, StandbySettings
from ..config import Paths
from ..image.specs import DEFAULT_TEMPLATES, TemplateSpec
from ..registry import Registry
from ..server.access.apikey import load_or_create_key
from ..server.access.ratelimit import RateLimitConfig, RateLimiter
from ..server.control.snapshots import RetentionPolicy
from ..server.metrics import Metrics
from ..util.progress import RoutedReporter, open_reporter
from ..util.steps import StepTimes
from ..util.system import yield_cpu
from .serve_standby import (
    is_supervised,
    keep_standby,
    record_stop_signals,
    restore_priority,
    stand_by,
    supervision_env,
)

DEFAULT_WORKSPACE = "default"


@dataclass(frozen=True)
class ServeOptions:
    data_dir: Path | None
    cache_dir: Path | None
    host: str
    port: int
    prespawn: int
    pool_mode: PoolMode
    max_concurrent_restores: int | None = None
    admission_queue: int | None = None
    admission_timeout_s: float | None = None
    reap_interval_s: float = 5.0
    net_pool: int = 16
    snapshot_grace_s: float | None = None
    orphan_sweep_interval_s: float | None = None
    paused_retention_s: float | None = None
    storage: StorageConfig = field(default_factory=StorageConfig)
    templates: tuple[TemplateSpec, ...] = DEFAULT_TEMPLATES
    max_sandboxes: int = 256
    on_stop: str | None = None
    memory_mib: int | None = None
    """Memory this host offers to placement (``None``: the host's ``MemTotal``)."""
    sandbox_domain: str | None = None
    """``{port}-{sandbox_id}.{domain}`` hosts reach sandbox ports (normal form: ``normal_domain``)."""
    tls: TlsListener | None = None
    """The HTTPS listener beside the plain one, if any."""


def serve(options: ServeOptions, console: Console) -> None:
    activation = take_activation()  # first: before any thread or child process could see the variables
    handover = take_handover()  # started by a running serve's upgrade (SIGUSR2): tell it when ready
    supervised = is_supervised(activation)  # a supervisor restarts it: the only case a standby is for
    if activation.get("http") is None:  # bound here, not by uvicorn: an upgrade hands this socket over
        activation.sockets["http"] = bind_http(options.host, options.port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the memory server's control calls
    paths = Paths.from_env(options.data_dir, options.cache_dir)
    config = HostConfig(
        paths=paths,
        prespawn=options.prespawn,
        pool_mode=options.pool_mode,
        net_pool=options.net_pool,
        storage=options.storage,
        templates=options.templates,
    )
    # validate every setting before anything starts (fail fast)
    admission_config = AdmissionConfig.from_env(
        max_concurrent=options.max_concurrent_restores,
        queue_length=options.admission_queue,
        timeout_s=options.admission_timeout_s,
    )
    limiter = RateLimiter.from_config(RateLimitConfig.from_env())
    retention = RetentionPolicy.from_env(
        options.snapshot_grace_s, options.orphan_sweep_interval_s, paused_s=options.paused_retention_s
    )
    stop_mode = [on_stop_mode(options.on_stop)]  # an upgrade stops as keep whatever the option says
    standby = StandbySettings.from_env()
    spawned = os.environ.pop(SPAWNED_ENV, None) == "1"
    paths.ensure()
    registry = Registry.for_data_dir(paths.data_dir)
    checked: list[bool] = []  # a standby checks the schema while it waits: not after the takeover (~0.17 s)

    def prepare() -> None:  # and computes what a start computes from the host alone (agent/host/prewarm.py)
        checked.append(registry.migrated_already())
        prewarm()

    may_stand_by = handover is None and standby.enabled and supervised
    start = stand_by(paths.data_dir, console, spawned, prepare) if may_stand_by else None
    if spawned and start is None:  # spawned as a standby, but its server stopped before it registered
        console.print("standby: the process that started this one no longer serves; exiting")
        exit_now()
    took_over = start is not None
    restore_priority()  # imports (and a standby's wait) ran niced: the start itself does not

    start_times = StepTimes("start")  # from the data dir's lock (a standby's or a successor's takeover)

    async def main() -> None:
        migrated = bool(checked) and checked[0]
        if handover is not None or took_over:  # imports are done: the data dir is released now or soon
            # a schema at its newest revision needs no migration: known now, not after the hand-over (~0.3 s)
            migrated = migrated or await asyncio.to_thread(registry.migrated_already)
            if handover is not None:  # an upgrade's successor computes ahead as a standby does, while still served
                await asyncio.to_thread(prewarm)
                announce_ready(handover)
                console.print("upgrade: ready; waiting for the previous process to hand over the data dir")
            await asyncio.to_thread(wait_unlocked, paths.data_dir)
        start_times.begin()
        held = gcpause.hold(asyncio.get_running_loop())  # released once serving (compose/gcpause.py)
        console.print(
            f"[bold]cryobox[/bold] data dir {paths.data_dir}, cache {paths.cache_dir}, "
            f"accelerator {config.accel.value}, registry {registry.url}"
        )
        if not migrated:
            await asyncio.to_thread(registry.migrate)
        workspace = await asyncio.to_thread(registry.ensure_workspace, DEFAULT_WORKSPACE)
        key, generated = load_or_create_key(paths.data_dir)
        await asyncio.to_thread(registry.import_key, workspace.id, key, "bootstrap")
        start_times.mark("registry")
        with open_reporter(console) as reporter, reporter.phase("preparing images and templates") as preparing:

            def lines(line: str) -> None:
                if line.startswith("debootstrap: "):
                    preparing.update(line[:100])
                else:
                    reporter(line)
                    preparing.update(line[:100])

            progress = RoutedReporter(reporter, lines)

            host, agent = await boot_agent(
                config,
                admission_config,
                AgentOptions(
                    name=socket.gethostname(), max_sandboxes=options.max_sandboxes, memory_mib=options.memory_mib
                ),
                progress,
            )
        start_times.mark("host")
        local: Agent = InProcessAgent(agent)
        metrics = Metrics()

        async def agent_metrics() -> str:
            return (await local.metrics_text()).decode()

        metrics.add_source(agent_metrics)
        control = build_control(registry, fleet_config(), retention, host.store, metrics, local={agent.name: local})
        app = create_app(
            control,
            limiter=limiter,
            host=agent.name,
            intervals=Intervals(reap_s=options.reap_interval_s),
            local_agents={agent.name: local},
            sandbox_domain=options.sandbox_domain,
        )
        # cached before serving: a restart's first requests missed it at once, queued behind the adoption's threads
        await app.state.ctx.keys.check(key)
        start_times.mark("app")
        service = host.service
        console.print(f"templates ready: {', '.join(service.templates)}")
        if generated:
            console.print(
                f"generated API key (saved in {paths.data_dir / 'api_key'}): [bold]{key}[/bold]", soft_wrap=True
            )
        else:
            console.print(f"API key (workspace {DEFAULT_WORKSPACE}): [bold]{key}[/bold]", soft_wrap=True)
        _print_urls(console, options, key)
        server = http_server(app, options.host, options.port)
        releasing = asyncio.create_task(gcpause.release_once_serving(server), name="collect once serving")
        stop_signals = record_stop_signals(server)

        def hand_over_to_standby() -> None:  # a supervisor's start with another configuration or code
            stop_mode[0] = OnStop.KEEP
            server.should_exit = True

        keeps_standby = standby.enabled and supervised and options.tls is None
        desk = StandbyDesk(paths.data_dir, hand_over_to_standby) if keeps_standby else None
        upgrading: list[asyncio.Task[None]] = []
        handed_over: list[int] = []

        async def upgrade() -> None:
            sock = activation.get("http")
            if options.tls is not None or sock is None:
                console.print("upgrade refused: a TLS listener is not handed over (restart instead)")
                return
            if desk is not None:  # the standby runs the old binary: the successor replaces it
                await desk.close(hand_over=False)
            successor = spawn_successor(sock, own_command(), supervision_env(supervised))
            console.print(f"upgrade: successor pid {successor.process.pid} starting; serving until it is ready")
            if not await successor.wait_ready():
                console.print(f"upgrade failed: the successor exited ({successor.process.poll()}); still serving")
                upgrading.clear()
                return
            console.print("upgrade: successor ready; stopping (sandboxes kept) to hand over")
            stop_mode[0] = OnStop.KEEP
            handed_over.append(successor.process.pid)  # systemd follows the successor from here (Type=notify)
            notify(f"MAINPID={successor.process.pid}", "STATUS=upgrading: the new process takes over")
            server.should_exit = True

        def on_upgrade() -> None:
            if not upgrading:
                upgrading.append(asyncio.create_task(upgrade(), name="upgrade"))

        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, on_upgrade)
        console.print(f"listening on {activation.describe('http')}", soft_wrap=True)
        console.print(start_times.describe(), soft_wrap=True)
        keeping = (
            asyncio.create_task(keep_standby(desk, server, activation, start, standby.grace_s, console))
            if desk is not None
            else None
        )
        try:
            async with readiness(server, stopping=lambda: not handed_over):  # after a hand-over: the successor's
                await serve_listeners(server, options.tls, activation)
        finally:
            releasing.cancel()
            held.cancel()
            gcpause.hold(asyncio.get_running_loop())  # nor may a collection delay the data dir's hand-over
            on_stop = stop_mode[0]
            if keeping is not None:
                keeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeping
            if desk is not None:  # a restart (SIGTERM, keep) leaves the data dir to the standby; a stop does not
                restart = stop_signals[-1:] == [signal.SIGTERM] and on_stop is OnStop.KEEP and not handed_over
                heir = await desk.close(hand_over=restart)
                server.stop_times.mark("standby told")
                if heir is not None:
                    console.print(f"standby pid {heir} takes over once this process has stopped")
            kept = host.service.running()  # counted before: a keep stop lets go of them (it printed 0)

            def released() -> None:
                server.stop_times.mark("lock released")
                yield_cpu()  # its teardown gives way to the standby or restart

            await host.close(on_stop, released=released)
            server.stop_times.mark("host closed")
            left = kept if on_stop is OnStop.KEEP else host.service.running()
            console.print(f"stopped ({on_stop.value}: {left} sandbox(es) left running)")
            console.print(server.stop_times.describe(), soft_wrap=True)

    # uvicorn shuts down gracefully on SIGTERM/SIGINT (open requests get GRACEFUL_STOP_S), then re-raises the
    # signal with the previous handler: make that handler a clean exit so a graceful stop exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    try:
        asyncio.run(main())
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    finally:
        registry.close()
    exit_now()


def _print_urls(console: Console, options: ServeOptions, key: str) -> None:
    base = f"http://{options.host}:{options.port}"
    console.print(f"export CRYOBOX_API_URL={base} CRYOBOX_API_KEY={key}", soft_wrap=True)
    console.print(  # E2B's SDKs (Python and JS), unchanged: every sandbox call goes to one URL (no wildcard DNS or TLS)
        f"export E2B_API_URL={base}/e2b E2B_SANDBOX_URL={base}/e2b/sandbox E2B_VOLUME_API_URL={base}/e2b "
        f"E2B_API_KEY={key}",
        soft_wrap=True,
    )
    if options.tls is not None:
        console.print(f"HTTPS on https://{options.tls.host}:{options.tls.port} ({options.tls.cert})", soft_wrap=True)
    domain = options.sandbox_domain
    if domain is not None:
        console.print(  # or with sandbox hosts: wildcard DNS *.DOMAIN to this server, HTTPS on 443
            f"sandbox hosts {{port}}-{{sandbox_id}}.{domain}: "
            f"export E2B_API_URL=https://api.{domain}/e2b E2B_DOMAIN={domain} "
            f"E2B_VOLUME_API_URL=https://api.{domain}/e2b E2B_API_KEY={key}",
            soft_wrap=True,
        )
    console.print(f"web console: {base}/ui (log in with the API key)", soft_wrap=True)


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
