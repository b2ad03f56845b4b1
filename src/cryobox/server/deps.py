"""Request-scoped dependencies. Nothing is global: the app's parts live on ``app.state.ctx``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from ..agent.vm import Accel
from ..errors import Unauthorized
from ..proxy import PortProxy
from ..registry import Registry, WorkspaceInfo
from .control import ControlPlane
from .forks_ctl import ForkControl
from .gate import bearer_key
from .keycache import KeyCache
from .metrics import Metrics
from .ratelimit import RateLimiter
from .tickets import PtyTickets


@dataclass
class AppContext:
    control: ControlPlane
    forks: ForkControl
    limiter: RateLimiter
    accel: Accel
    host: str
    version: str
    keys: KeyCache
    tickets: PtyTickets = field(default_factory=PtyTickets)
    proxy: PortProxy = field(default_factory=PortProxy)

    @property
    def registry(self) -> Registry:
        return self.control.registry

    @property
    def metrics(self) -> Metrics:
        return self.control.metrics


@dataclass(frozen=True)
class Caller:
    """An authenticated request: the app's parts plus the caller's workspace."""

    app: AppContext
    workspace: WorkspaceInfo

    @property
    def workspace_id(self) -> str:
        return self.workspace.id

    @property
    def control(self) -> ControlPlane:
        return self.app.control


def context(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


async def authenticated(request: Request, ctx: Annotated[AppContext, Depends(context)]) -> Caller:
    key = bearer_key(request.headers.get("authorization"))
    if key is None:
        raise Unauthorized("missing bearer API key (Authorization: Bearer <key>)")
    workspace = await asyncio.to_thread(ctx.keys.authenticate, key)
    if workspace is None:
        raise Unauthorized("invalid or revoked API key")
    ctx.limiter.check(workspace.id)
    return Caller(app=ctx, workspace=workspace)


Ctx = Annotated[Caller, Depends(authenticated)]
PublicCtx = Annotated[AppContext, Depends(context)]
