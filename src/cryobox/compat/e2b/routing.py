"""The E2B API's boundary: its authentication (``X-API-Key``) and its error shape (``{"code", "message"}``).

Every failure of a route under ``/e2b`` leaves in E2B's shape with the status the SDK maps onto its exceptions
(401 → ``AuthenticationException``, 404 → ``NotFoundException``/``SandboxNotFoundException``, 409, 429 →
``RateLimitException``, 503 → ``ServiceBusyException``); keys, workspaces, rate limits and quotas are the same
as for ``/v1``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ...errors import CryoboxError, HostUnavailable, QuotaExceeded, Unauthorized
from ...server.access.gate import bearer_key
from ...server.routes.deps import AppContext, Caller, context
from .views import error

log = logging.getLogger(__name__)


def e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error(status, message), status_code=status, headers=headers)


def from_cryobox(exc: CryoboxError) -> JSONResponse:
    headers = None
    if isinstance(exc, HostUnavailable | QuotaExceeded):
        headers = {"Retry-After": str(max(1, math.ceil(getattr(exc, "retry_after_s", 1.0))))}
    if exc.http_status >= 500:
        log.error("E2B request failed: %s", exc, exc_info=exc.http_status == 500)
    return e2b_error(exc.http_status, f"{exc.message} ({exc.code})", headers)


class E2BRoute(APIRoute):
    """Turns whatever a route (or its dependencies) raises into E2B's error shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except CryoboxError as exc:
                return from_cryobox(exc)
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ()))
                return e2b_error(400, f"invalid request: {where}: {first.get('msg', 'invalid')}")

        return guarded


async def e2b_caller(request: Request, ctx: Annotated[AppContext, Depends(context)]) -> Caller:
    key = (request.headers.get("x-api-key") or "").strip() or bearer_key(request.headers.get("authorization"))
    if not key:
        raise Unauthorized("missing API key (X-API-Key: <a cryobox key>)")
    workspace = await ctx.keys.check(key)
    if workspace is None:
        raise Unauthorized("invalid or revoked API key")
    ctx.limiter.check(workspace.id)
    return Caller(app=ctx, workspace=workspace)


E2BCtx = Annotated[Caller, Depends(e2b_caller)]
