"""The FastAPI application factory. Dependencies come in as arguments; nothing is global."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fastapi import FastAPI

from .. import __version__
from ..agentapi import Agent
from ..agentapi import models as am
from ..agentapi.heartbeat import heartbeat_of
from ..compat.e2b.access import SandboxAccess
from ..compat.e2b.api import router as e2b_router
from ..compat.e2b.catalog import router as e2b_catalog_router
from ..compat.e2b.network import E2BSettings
from ..compat.e2b.observe import router as e2b_observe_router
from ..compat.e2b.sandbox_hosts import SandboxHosts, normal_domain
from ..compat.e2b.sandbox_url import mount_sandbox_url
from ..compat.e2b.templates import router as e2b_templates_router
from ..compat.e2b.volumecontent import router as e2b_volume_content_router
from ..compat.e2b.volumes import router as e2b_volumes_router
from ..compat.pandastack.repl import router as repl_router
from ..compat.pandastack.templates import router as pandastack_templates_router
from ..console.bisect_jobs import BisectJobs
from ..console.bisect_platform import ControlPlatform
from ..console.routes_api import router as console_api_router
from ..console.routes_session import router as console_session_router
from ..console.sampler import MetricsSampler, exposition_source
from ..console.state import ConsoleState
from ..console.static import mount_console
from ..mcpserver.http import McpEndpoint, McpRoute
from ..registry.sessions import SessionRecords
from ..server.access.gate import AuthGateMiddleware, FailedAuth
from ..server.access.keycache import KeyCache
from ..server.access.limits import BodyLimitMiddleware
from ..server.access.ratelimit import RateLimiter
from ..server.access.sessions import PURGE_EVERY_S, ConsoleSessions
from ..server.control.fleet import DEFAULT_HEARTBEAT_INTERVAL_S
from ..server.control.forks import ForkControl
from ..server.control.sandboxes import ControlPlane
from ..server.control.volumecontent import SWEEP_EVERY_S as VOLUME_CONTENT_SWEEP_S
from ..server.execlog import ExecHistory
from ..server.metrics import MetricsMiddleware
from ..server.routes.builds import OWN_BODY_LIMITS
from ..server.routes.builds import router as builds_router
from ..server.routes.code import router as code_router
from ..server.routes.deps import AppContext
from ..server.routes.errors import install_error_handlers
from ..server.routes.files import router as files_router
from ..server.routes.fleet import router as fleet_router
from ..server.routes.forks import router as forks_router
from ..server.routes.network import router as network_router
from ..server.routes.observe import router as observe_router
from ..server.routes.platform import router as platform_router
from ..server.routes.ports import router as ports_router
from ..server.routes.procs import router as procs_router
from ..server.routes.pty import router as pty_router
from ..server.routes.quota import router as quota_router
from ..server.routes.sandboxes import router as sandboxes_router
from ..server.routes.snapshots import router as snapshots_router
from ..server.routes.volumefiles import router as volume_files_router
from ..server.routes.volumes import router as volumes_router
from .warmup import warm_routes

log = logging.getLogger(__name__)


REGISTER_AFTER_S = 1.0
"""A restarted process registers its local agents this long after it serves (the previous process's heartbeats keep
them alive meanwhile): the new boot's reconcile took 0.1-0.4 s of the loop that the first requests waited for."""


WARM_ROUTES_AFTER_S = 2.0
"""Routes not yet matched are built this long after the app serves (``warm_routes``): the first requests after a
restart go first (building them at once delayed a restart's first exec by ~0.5 s under load)."""


@dataclass(frozen=True)
class Intervals:
    reap_s: float = 5.0
    heartbeat_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    """How often the in-process agent reports in (HTTP agents have their own setting)."""
    key_cache_s: float = 5.0
    session_ttl_s: float = 12 * 3600.0
    """A console session's sliding lifetime."""
    metrics_sample_s: float = 2.0
    """The console's metrics sampler."""


def wire_registration(control: ControlPlane) -> None:
    """What happens when an agent registers: template rows, custom template builds, snapshot reconcile, and the
    copies of sandboxes and volumes that moved elsewhere (or went) meanwhile are forgotten."""

    async def registered(name: str, hb: am.Heartbeat) -> None:
        agent = await control.fleet.agent(name)
        await control.templates.agent_registered(name, agent, dict(hb.capacity.templates_ready))
        await control.snapshots.reconcile(name, agent, {s.id for s in hb.sandboxes})
        await control.hibernations.agent_registered(name, hb)
        await control.volumes.mover.forget_strays(name)

    control.fleet.on_register(registered)


def create_app(
    control: ControlPlane,
    *,
    limiter: RateLimiter,
    host: str,
    intervals: Intervals | None = None,
    local_agents: dict[str, Agent] | None = None,
    e2b: E2BSettings | None = None,
    sandbox_domain: str | None = None,
) -> FastAPI:
    """``local_agents`` are in-process agents (``cryobox serve``): registered before the app serves, and
    heartbeating from here. ``e2b``: the E2B front door's settings (default: from the environment, read now:
    ``CRYOBOX_E2B_INTERNET``). ``sandbox_domain``: hosts ``{port}-{sandbox_id}.{domain}`` reach the sandbox's
    ports (``compat/e2b/sandbox_hosts.py``)."""
    e2b_settings = e2b if e2b is not None else E2BSettings.from_env()  # a bad value fails here, at start
    domain = normal_domain(sandbox_domain) if sandbox_domain else None
    every_s = intervals or Intervals()
    local = dict(local_agents or {})
    control.fleet.local.update(local)
    wire_registration(control)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def register() -> None:
            for agent in local.values():
                await control.fleet.heartbeat(await heartbeat_of(agent))
            for row, _agent in await control.fleet.live_agents():  # copies to the store a process left unfinished
                await control.snapshots.store_pending(row.name)

        async def register_logged() -> None:
            await asyncio.sleep(REGISTER_AFTER_S)  # the first requests after a restart go first
            try:
                await register()
            except Exception:  # the next beat registers it (every heartbeat_s)
                log.exception("registering this host's agents failed")

        # a restart or an upgrade: the registry has this host's agents alive (the previous process's heartbeats),
        # so placement works already and the first beat (a new boot's reconcile, ~0.1-0.4 s) follows the answer
        # to requests instead of delaying it; a first start registers before it serves
        registering = None
        if local and all([await control.fleet.alive(name) for name in local]):
            registering = asyncio.create_task(register_logged(), name="register local agents")
        else:
            await register()

        async def every(interval_s: float, what: str, job: Callable[[], Awaitable[object]]) -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await job()
                except Exception:
                    log.exception("%s failed", what)

        async def beat() -> None:
            for agent in local.values():
                await control.fleet.heartbeat(await heartbeat_of(agent))

        tasks = [
            asyncio.create_task(every(every_s.reap_s, "ttl reaper", control.reap_expired)),
            asyncio.create_task(
                every(control.snapshots.retention.sweep_interval_s, "orphan sweep", control.snapshots.sweep)
            ),
            asyncio.create_task(
                every(max(0.2, control.fleet.config.deadline_s / 4), "agent liveness", control.fleet.check_stale)
            ),
            asyncio.create_task(every(VOLUME_CONTENT_SWEEP_S, "volume content sweep", control.volume_content.sweep)),
        ]
        tasks.append(asyncio.create_task(console.sampler.run(), name="console metrics sampler"))
        tasks.append(
            asyncio.create_task(
                every(PURGE_EVERY_S, "console session purge", lambda: asyncio.to_thread(sessions.purge))
            )
        )
        if local:
            tasks.append(asyncio.create_task(every(every_s.heartbeat_s, "local heartbeat", beat)))
        if registering is not None:
            tasks.append(registering)

        async def warm() -> None:  # what FastAPI builds at a router's first match, built while serving
            await asyncio.sleep(WARM_ROUTES_AFTER_S)
            await warm_routes(app)

        tasks.append(asyncio.create_task(warm(), name="warm routes"))
        try:
            async with mcp.run():  # the MCP SDK's session manager: its task group lives as long as the app
                yield
        finally:
            await console.bisects.close()  # cancelled, children killed, before the rest closes
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await control.volume_content.close()
            await control.templates.close()
            await control.snapshots.close()
            await control.hibernations.close()
            await control.placement.close()
            await control.fleet.close()
            await app.state.ctx.proxy.aclose()
            await app.state.envd.aclose()

    app = FastAPI(
        title="cryobox",
        version=__version__,
        lifespan=lifespan,
        description="Self-hosted microVM sandboxes where every create is a snapshot restore.",
    )
    keys = KeyCache(control.registry.authenticate, ttl_s=every_s.key_cache_s)
    sessions = ConsoleSessions(
        SessionRecords(control.registry.database), ttl_s=every_s.session_ttl_s, cache_s=every_s.key_cache_s
    )
    failures = FailedAuth()
    forks = ForkControl(control)
    console = ConsoleState(
        sampler=MetricsSampler(exposition_source(control.metrics.render_all), interval_s=every_s.metrics_sample_s),
        bisects=BisectJobs(ControlPlatform(control, forks)),
    )
    app.state.console = console
    app.state.e2b = e2b_settings
    app.state.ctx = AppContext(
        control=control,
        forks=forks,
        limiter=limiter,
        host=host,
        version=__version__,
        keys=keys,
        sessions=sessions,
        failures=failures,
        execs=ExecHistory(),
        sandbox_domain=domain,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, own_limits=OWN_BODY_LIMITS)
    # outside the body limit: a request's key is checked before anything reads its body
    sandbox_access = SandboxAccess(control, limiter)
    app.add_middleware(
        AuthGateMiddleware,
        authenticate=keys.check,
        sandbox_token=sandbox_access.verify,
        sessions=sessions,
        failures=failures,
    )
    app.add_middleware(MetricsMiddleware, metrics=control.metrics)
    if domain is not None:  # outermost: a sandbox host's request meets the gate as a sandbox URL request
        app.add_middleware(SandboxHosts, domain=domain)
    app.include_router(sandboxes_router)
    app.include_router(network_router)
    app.include_router(volumes_router)
    app.include_router(volume_files_router)
    app.include_router(observe_router)
    app.include_router(files_router)
    app.include_router(snapshots_router)
    app.include_router(forks_router)
    app.include_router(pandastack_templates_router)  # before platform_router: /v1/templates/builds vs /{name}
    app.include_router(builds_router)
    app.include_router(platform_router)
    app.include_router(pty_router)
    app.include_router(fleet_router)
    app.include_router(quota_router)
    app.include_router(ports_router)
    app.include_router(procs_router)
    app.include_router(code_router)
    app.include_router(repl_router)
    mcp = app.state.mcp = McpEndpoint(app)  # its tools call this app in process, with the caller's key
    app.router.routes.append(McpRoute(mcp))
    app.include_router(console_session_router)
    app.include_router(console_api_router)
    mount_console(app)  # after the console's API routes (they take precedence over its files)
    # the sandbox URL first: the E2B API's catch-all 404 would otherwise answer for it
    app.state.envd = mount_sandbox_url(app, sandbox_access, app.state.ctx.proxy)
    app.include_router(e2b_templates_router)  # before e2b_router, whose last route catches the rest
    app.include_router(e2b_volumes_router)
    app.include_router(e2b_volume_content_router)
    app.include_router(e2b_catalog_router)
    app.include_router(e2b_observe_router)  # before e2b_router: GET /sandboxes/metrics vs /sandboxes/{id}
    app.include_router(e2b_router)
    return app
