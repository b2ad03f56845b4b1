"""Request-scoped dependencies: the service and API-key check (no module-level state: all on app.state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ..agent.service import SandboxService
from ..agent.vm import Accel
from .auth import check_bearer


@dataclass
class AppContext:
    service: SandboxService
    api_key: str
    accel: Accel
    host: str
    version: str


def context(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


def authenticated(request: Request, ctx: Annotated[AppContext, Depends(context)]) -> AppContext:
    check_bearer(request.headers.get("authorization"), ctx.api_key)
    return ctx


Ctx = Annotated[AppContext, Depends(authenticated)]
PublicCtx = Annotated[AppContext, Depends(context)]
