"""The one boundary where cryobox's error tree becomes envd's: Connect codes for the RPCs, and envd's JSON error
(``{"code": <http status>, "message": ...}``) for its REST routes.

The E2B SDK maps Connect codes onto its exceptions (``invalid_argument`` → ``InvalidArgumentException``,
``unauthenticated`` → ``AuthenticationException``, ``not_found`` → ``NotFoundException`` / ``FileNotFoundException``,
``resource_exhausted`` → ``RateLimitException``, ``unavailable`` whose message says "was not found" →
``SandboxNotRunningException``, ``deadline_exceeded`` → ``TimeoutException``; anything else a ``SandboxException``)
and REST statuses likewise (400, 401, 404, 429, 502, 507). A foreign exception is an ``internal`` error whose
details stay in the log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from pydantic import ValidationError

from ....errors import (
    CryoboxError,
    Forbidden,
    GuestError,
    HostUnavailable,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxTimeout,
    StateError,
    StoreThrottled,
    Unauthorized,
    WorkspaceQuotaExceeded,
)
from .session import SandboxUnavailable

log = logging.getLogger(__name__)

REQ = TypeVar("REQ")
RES = TypeVar("RES")

CONNECT_CODES: tuple[tuple[type[CryoboxError], Code], ...] = (
    (SandboxUnavailable, Code.UNAVAILABLE),
    (InvalidArgument, Code.INVALID_ARGUMENT),
    (Unauthorized, Code.UNAUTHENTICATED),
    (Forbidden, Code.PERMISSION_DENIED),
    (NotFound, Code.NOT_FOUND),
    (StateError, Code.FAILED_PRECONDITION),
    (PayloadTooLarge, Code.RESOURCE_EXHAUSTED),
    (WorkspaceQuotaExceeded, Code.RESOURCE_EXHAUSTED),
    (QuotaExceeded, Code.RESOURCE_EXHAUSTED),
    (HostUnavailable, Code.UNAVAILABLE),
    (StoreThrottled, Code.UNAVAILABLE),
    (SandboxTimeout, Code.DEADLINE_EXCEEDED),
)
"""First match wins; any other :class:`CryoboxError` is ``internal``."""

INTERNAL_MESSAGE = "internal error"


def _validation_message(err: ValidationError) -> str:
    problems = [f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in err.errors()[:5]]
    return "invalid request: " + "; ".join(problems)


def connect_error(exc: Exception) -> ConnectError:
    """``exc`` as the Connect error the SDK expects."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, ValidationError):
        return ConnectError(Code.INVALID_ARGUMENT, _validation_message(exc))
    if isinstance(exc, CryoboxError):
        for cls, code in CONNECT_CODES:
            if isinstance(exc, cls):
                return ConnectError(code, exc.message)
        log.warning("envd call failed: %s (%s)", exc.message, exc.code)
        return ConnectError(Code.INTERNAL, exc.message)
    log.exception("envd call failed unexpectedly", exc_info=exc)
    return ConnectError(Code.INTERNAL, INTERNAL_MESSAGE)


def envd_error(exc: Exception) -> tuple[int, dict[str, Any], list[tuple[str, str]]]:
    """``exc`` as envd's REST error: status, JSON body and extra headers (``Retry-After`` for a 429/503)."""
    if isinstance(exc, ValidationError):
        return 400, {"code": 400, "message": _validation_message(exc)}, []
    if not isinstance(exc, CryoboxError):
        log.exception("envd file call failed unexpectedly", exc_info=exc)
        return 500, {"code": 500, "message": INTERNAL_MESSAGE}, []
    status = exc.http_status if exc.http_status >= 400 else 500
    if type(exc) is GuestError:
        status = 500  # what E2B's envd answers when its own work fails (its SDK reads a 502 as the sandbox's timeout)
    if status >= 500 and not isinstance(exc, (SandboxUnavailable, HostUnavailable, StoreThrottled)):
        log.warning("envd file call failed: %s (%s)", exc.message, exc.code)
    headers: list[tuple[str, str]] = []
    retry_after = getattr(exc, "retry_after_s", None)
    if isinstance(retry_after, int | float) and status in (429, 503):
        headers.append(("retry-after", str(max(1, round(retry_after)))))
    return status, {"code": status, "message": exc.message}, headers


class ErrorInterceptor:
    """Applies :func:`connect_error` to every unary, server-streaming and client-streaming call."""

    async def intercept_unary(
        self,
        call_next: Callable[[REQ, RequestContext[Any, Any]], Awaitable[RES]],
        request: REQ,
        ctx: RequestContext[Any, Any],
        /,
    ) -> RES:
        try:
            return await call_next(request, ctx)
        except Exception as exc:
            raise connect_error(exc) from exc

    async def intercept_client_stream(
        self,
        call_next: Callable[[AsyncIterator[REQ], RequestContext[Any, Any]], Awaitable[RES]],
        request: AsyncIterator[REQ],
        ctx: RequestContext[Any, Any],
        /,
    ) -> RES:
        try:
            return await call_next(request, ctx)
        except Exception as exc:
            raise connect_error(exc) from exc

    async def intercept_server_stream(
        self,
        call_next: Callable[[REQ, RequestContext[Any, Any]], AsyncIterator[RES]],
        request: REQ,
        ctx: RequestContext[Any, Any],
        /,
    ) -> AsyncIterator[RES]:
        inner = call_next(request, ctx)
        try:
            async for item in inner:
                yield item
        except Exception as exc:
            raise connect_error(exc) from exc
        finally:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()
