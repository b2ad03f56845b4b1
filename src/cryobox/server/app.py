"""The FastAPI application factory. Dependencies come in as arguments; nothing is global."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from .. import __version__
from ..agent.service import SandboxService
from ..agent.vm import Accel
from .deps import AppContext
from .errors import install_error_handlers
from .routes_files import router as files_router
from .routes_platform import router as platform_router
from .routes_sandboxes import router as sandboxes_router

log = logging.getLogger(__name__)


def create_app(
    service: SandboxService, *, api_key: str, accel: Accel, host: str, reap_interval_s: float = 5.0
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def reaper() -> None:
            while True:
                await asyncio.sleep(reap_interval_s)
                try:
                    for sandbox_id in await service.reap_expired():
                        log.info("sandbox %s expired (ttl)", sandbox_id)
                except Exception:
                    log.exception("ttl reaper failed")

        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await service.close()

    app = FastAPI(title="cryobox", version=__version__, lifespan=lifespan)
    app.state.ctx = AppContext(service=service, api_key=api_key, accel=accel, host=host, version=__version__)
    install_error_handlers(app)
    app.include_router(sandboxes_router)
    app.include_router(files_router)
    app.include_router(platform_router)
    return app
