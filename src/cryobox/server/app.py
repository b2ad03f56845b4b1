"""The FastAPI application factory. Dependencies come in as arguments; nothing is global."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI

from .. import __version__
from ..agent.vm import Accel
from .control import ControlPlane
from .deps import AppContext
from .errors import install_error_handlers
from .limits import BodyLimitMiddleware
from .metrics import MetricsMiddleware
from .ratelimit import RateLimiter
from .routes_files import router as files_router
from .routes_forks import router as forks_router
from .routes_platform import router as platform_router
from .routes_pty import router as pty_router
from .routes_sandboxes import router as sandboxes_router
from .routes_snapshots import router as snapshots_router

log = logging.getLogger(__name__)


def create_app(
    control: ControlPlane, *, limiter: RateLimiter, accel: Accel, host: str, reap_interval_s: float = 5.0
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await control.startup()

        async def every(interval_s: float, what: str, job: Callable[[], Awaitable[object]]) -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await job()
                except Exception:
                    log.exception("%s failed", what)

        tasks = [
            asyncio.create_task(every(reap_interval_s, "ttl reaper", control.reap_expired)),
            asyncio.create_task(
                every(control.snapshots.retention.sweep_interval_s, "orphan sweep", control.snapshots.sweep)
            ),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await control.templates.close()
            await control.service.close()

    app = FastAPI(
        title="cryobox",
        version=__version__,
        lifespan=lifespan,
        description="Self-hosted microVM sandboxes where every create is a snapshot restore.",
    )
    app.state.ctx = AppContext(control=control, limiter=limiter, accel=accel, host=host, version=__version__)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=control.metrics)
    app.include_router(sandboxes_router)
    app.include_router(files_router)
    app.include_router(snapshots_router)
    app.include_router(forks_router)
    app.include_router(platform_router)
    app.include_router(pty_router)
    return app
