"""A host agent's HTTP face: every :class:`~.interface.Agent` operation under ``/agent/v1``, behind the node token.

``create_agent_app(agent, token)`` is what ``cryobox agent`` serves; :class:`~.http_client.HttpAgent` is the
other end. Every route but ``GET /agent/v1/healthz`` needs ``Authorization: Bearer <token>``: the check runs in
ASGI middleware, before any route, body or the agent is touched. Errors leave as ``{"error", "code",
"details"}`` with the code's status (``Retry-After`` for ``HostUnavailable``/``QuotaExceeded``); a malformed
request is ``400 invalid_argument``, anything unexpected ``500 internal`` with a generic message (logged here).
The operations' routes are derived from their table (:mod:`.http_routes`); written here are ``healthz`` (no
token, no agent) and, in :mod:`.http_ports`, the port proxy.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import CryoboxError, InvalidArgument
from .http_errors import cryobox_error_response, error_response, validation_response
from .http_fast import FastRoutes, fits
from .http_ports import add_port_routes
from .http_routes import add_operation_routes, hot_first
from .interface import MAX_FILE_BYTES, OPERATIONS, Agent

log = logging.getLogger(__name__)

PREFIX = "/agent/v1"
HEALTHZ = f"{PREFIX}/healthz"
MAX_BODY_BYTES = MAX_FILE_BYTES + (32 << 20)
"""Any request body (JSON included: exec stdin is base64); raw file bodies have their own, tighter limit."""
MetricsText = Callable[[], Awaitable[bytes]]

_STATUS_CODES = {400: "invalid_argument", 401: "unauthorized", 404: "not_found", 413: "payload_too_large"}


class _AgentRoute(APIRoute):
    """Turns whatever a route raises into the wire format right here (nothing reaches the server's own
    error middleware, which would log a second traceback)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except CryoboxError as exc:
                return cryobox_error_response(exc)
            except RequestValidationError as exc:
                return validation_response(exc)
            except StarletteHTTPException:
                raise
            except Exception:
                log.exception("agent request %s %s failed", request.method, request.url.path)
                return error_response(500, "internal error", "internal")

        return guarded


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CryoboxError)
    async def cryobox_error(_: Request, exc: CryoboxError) -> JSONResponse:
        return cryobox_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), _STATUS_CODES.get(exc.status_code, "http_error"))


# --- authentication and body size (pure ASGI: runs before routing and before any body is read) ------------------


class _BodyTooLarge(Exception):
    pass


class AgentGuard:
    """Refuses requests without the node token (401) and bodies past ``max_body_bytes`` (413)."""

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self._token = token.encode()
        self.max_body_bytes = max_body_bytes

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, credential = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not self._authorized(scope):
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] != HEALTHZ and not self._authorized(scope):
            response = error_response(401, "missing or invalid agent token", "unauthorized", None)
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
        await self._limited(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_body_bytes
        response = error_response(413, f"request body exceeds {limit} bytes", "payload_too_large", {"limit": limit})
        await response(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        seen = 0
        exceeded = started = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # whatever the app made of the failed read, the answer is 413
                return
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            pass
        if exceeded and not started:
            await self._too_large(scope, receive, send)


# --- the app ------------------------------------------------------------------------------------------------------


def create_agent_app(
    agent: Agent, token: str, *, metrics_text: MetricsText | None = None, plain_routes: bool = True
) -> FastAPI:
    """The agent's HTTP API for ``agent``, accepting requests that carry ``token``.

    ``metrics_text``, if given, produces the body of ``GET /agent/v1/metrics`` instead of
    ``agent.metrics_text()`` (e.g. the agent process's whole Prometheus registry). The operations whose wire form
    is plain are answered without FastAPI (:mod:`.http_fast`) unless ``plain_routes`` is off (a test compares).
    """
    if not token or token != token.strip():
        raise InvalidArgument("the agent's node token must be a non-empty string without surrounding whitespace")
    app = FastAPI(title="cryobox agent", docs_url=None, redoc_url=None, openapi_url=None)
    # the routes go on the app's own router, not an included one: FastAPI matches an included router's routes
    # twice per request (does it match, then which route), and matching was a third of this server's CPU per call
    app.router.route_class = _AgentRoute

    @app.get(HEALTHZ)
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    overrides = {"metrics_text": metrics_text} if metrics_text is not None else {}
    plain = [op for op in sorted(OPERATIONS.values(), key=hot_first) if fits(op) and op.name not in overrides]
    plain = plain if plain_routes else []
    add_operation_routes(app.router, agent, overrides, prefix=PREFIX, skip={op.name for op in plain})
    add_port_routes(app, agent, token=token)
    _install_error_handlers(app)
    if plain:
        app.add_middleware(FastRoutes, agent=agent, ops=plain, prefix=PREFIX)
    app.add_middleware(AgentGuard, token=token)
    return app


__all__ = ["HEALTHZ", "MAX_BODY_BYTES", "PREFIX", "AgentGuard", "create_agent_app"]
