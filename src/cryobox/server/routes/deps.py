"""Request-scoped dependencies. Nothing is global: the app's parts live on ``app.state.ctx``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from ...errors import Unauthorized
from ...proxy import PortProxy
from ...registry import Registry, WorkspaceInfo
from ..access import cookies as console_auth
from ..access.gate import FailedAuth, bearer_key
from ..access.keycache import KeyCache
from ..access.ratelimit import RateLimiter
from ..access.sessions import CSRF_HEADER, ConsoleSessions
from ..access.tickets import PtyTickets
from ..control.forks import ForkControl
from ..control.sandboxes import ControlPlane
from ..execlog import ExecHistory
from ..metrics import Metrics


@dataclass
class AppContext:
    control: ControlPlane
    forks: ForkControl
    limiter: RateLimiter
    host: str
    version: str
    keys: KeyCache
    sessions: ConsoleSessions
    execs: ExecHistory
    """The last exec calls per sandbox on this replica (the console shows them)."""
    failures: FailedAuth = field(default_factory=FailedAuth)
    """Bad keys per client address, shared by the front gate and ``POST /ui/login``."""
    tickets: PtyTickets = field(default_factory=PtyTickets)
    proxy: PortProxy = field(default_factory=PortProxy)
    sandbox_domain: str | None = None
    """Where ``{port}-{sandbox_id}.{domain}`` hosts reach sandbox ports (``--sandbox-domain``), if anywhere."""

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
    token = console_auth.session_token(request.headers.get("cookie"))
    if key is None and token is not None and console_auth.cookie_allowed(request.url.path):
        csrf = request.headers.get(CSRF_HEADER)
        session = await asyncio.to_thread(console_auth.check_session, ctx.sessions, token, request.method, csrf)
        workspace = session.workspace
    else:
        if key is None:
            raise Unauthorized("missing bearer API key (Authorization: Bearer <key>)")
        found = await ctx.keys.check(key)
        if found is None:
            raise Unauthorized("invalid or revoked API key")
        workspace = found
    ctx.limiter.check(workspace.id)
    return Caller(app=ctx, workspace=workspace)


Ctx = Annotated[Caller, Depends(authenticated)]
PublicCtx = Annotated[AppContext, Depends(context)]
