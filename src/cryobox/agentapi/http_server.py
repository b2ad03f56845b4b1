"""A host agent's HTTP face: every :class:`~.interface.Agent` method under ``/agent/v1``, behind the node token.

``create_agent_app(agent, token)`` is what ``cryobox agent`` serves; :class:`~.http_client.HttpAgent` is the
other end. Every route but ``GET /agent/v1/healthz`` needs ``Authorization: Bearer <token>``: the check runs in
ASGI middleware, before any route, body or the agent is touched. Errors leave as ``{"error", "code",
"details"}`` with the code's status (``Retry-After`` for ``HostUnavailable``/``QuotaExceeded``); a malformed
request is ``400 invalid_argument``, anything unexpected ``500 internal`` with a generic message (logged here).
Streamed and raw-body routes live in :mod:`.http_streams`.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import CryoboxError, HostUnavailable, InvalidArgument, QuotaExceeded
from . import models as m
from .http_ports import add_port_routes
from .http_procs import add_proc_routes
from .http_streams import MAX_FILE_BYTES, add_stream_routes
from .interface import FILE_OPS, Agent

log = logging.getLogger(__name__)

PREFIX = "/agent/v1"
HEALTHZ = f"{PREFIX}/healthz"
MAX_BODY_BYTES = MAX_FILE_BYTES + (32 << 20)
"""Any request body (JSON included: exec stdin is base64); raw file bodies have their own, tighter limit."""
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MetricsText = Callable[[], Awaitable[bytes]]

_STATUS_CODES = {400: "invalid_argument", 401: "unauthorized", 404: "not_found", 413: "payload_too_large"}


# --- errors ------------------------------------------------------------------------------------------------------


def error_response(
    status: int, message: str, code: str, details: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message or code, "code": code, "details": details or {}}, status, headers)


def cryobox_error_response(exc: CryoboxError) -> JSONResponse:
    headers = None
    if isinstance(exc, HostUnavailable | QuotaExceeded):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    status = exc.http_status if exc.http_status >= 400 else 500
    if status == 500:
        log.error("agent call failed: %s", exc, exc_info=exc)
    return error_response(status, exc.message, exc.code, exc.details, headers)


def validation_response(exc: RequestValidationError) -> JSONResponse:
    problems = [{"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))} for err in exc.errors()]
    first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
    message = f"invalid request: {'.'.join(first['loc'])}: {first['msg']}"
    return error_response(400, message, "invalid_argument", {"errors": problems})


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


# --- routes ------------------------------------------------------------------------------------------------------


class FileOpBody(BaseModel):
    op: str
    path: str


class PruneBody(BaseModel):
    keep: list[str]


class PruneResult(BaseModel):
    removed: list[str]


def _no_content() -> Response:
    return Response(status_code=204)


def _host_routes(router: APIRouter, agent: Agent, metrics_text: MetricsText | None) -> None:
    @router.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @router.get("/info")
    async def info() -> m.AgentInfo:
        return await agent.info()

    @router.get("/capacity")
    async def capacity() -> m.Capacity:
        return await agent.capacity()

    @router.get("/templates")
    async def templates() -> list[m.TemplateInfo]:
        return await agent.templates()

    @router.delete("/templates/{name}", status_code=204)
    async def remove_template(name: str) -> Response:
        await agent.remove_template(name)
        return _no_content()

    @router.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        text = await (metrics_text or agent.metrics_text)()
        return Response(content=text, media_type=METRICS_MEDIA_TYPE)


def _sandbox_routes(router: APIRouter, agent: Agent) -> None:
    @router.get("/sandboxes")
    async def list_sandboxes() -> list[m.SandboxInfo]:
        return await agent.list_sandboxes()

    @router.post("/sandboxes")
    async def create(body: m.CreateSpec) -> m.SandboxInfo:
        return await agent.create(body)

    @router.get("/sandboxes/{sandbox_id}")
    async def get(sandbox_id: str) -> m.SandboxInfo:
        return await agent.get(sandbox_id)

    @router.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def delete(sandbox_id: str) -> Response:
        await agent.delete(sandbox_id)
        return _no_content()

    actions = {
        "pause": agent.pause,
        "resume": agent.resume,
        "hibernate": agent.hibernate,
        "wake": agent.wake,
        "touch": agent.touch,
    }
    for action, call in actions.items():

        def make(call: Callable[[str], Awaitable[m.SandboxInfo]]) -> Callable[[str], Awaitable[m.SandboxInfo]]:
            async def route(sandbox_id: str) -> m.SandboxInfo:
                return await call(sandbox_id)

            return route

        router.add_api_route(f"/sandboxes/{{sandbox_id}}/{action}", make(call), methods=["POST"], name=action)

    @router.post("/hibernations/{sandbox_id}/store")
    async def store_hibernation(sandbox_id: str) -> m.StoredHibernation:
        return await agent.store_hibernation(sandbox_id)

    @router.post("/hibernations/{sandbox_id}/wake")
    async def wake_stored(sandbox_id: str, body: m.WakeSpec) -> m.SandboxInfo:
        if body.sandbox_id != sandbox_id:
            raise InvalidArgument("the body's sandbox_id is not the one in the path", details={"id": sandbox_id})
        return await agent.wake_stored(body)

    @router.patch("/sandboxes/{sandbox_id}/lifecycle")
    async def set_lifecycle(sandbox_id: str, body: m.LifecyclePatch) -> m.SandboxInfo:
        return await agent.set_lifecycle(sandbox_id, body)

    @router.post("/sandboxes/{sandbox_id}/exec")
    async def exec_(sandbox_id: str, body: m.ExecRequest) -> m.ExecResult:
        return await agent.exec(sandbox_id, body)

    @router.post("/sandboxes/{sandbox_id}/files/op")
    async def file_op(sandbox_id: str, body: FileOpBody) -> m.FsReply:
        if body.op not in FILE_OPS:
            raise InvalidArgument(f"unknown file op {body.op!r}", details={"ops": sorted(FILE_OPS)})
        return await agent.file_op(sandbox_id, body.op, body.path)

    @router.get("/sandboxes/{sandbox_id}/net")
    async def inspect_net(sandbox_id: str) -> m.NetInspection:
        return await agent.inspect_net(sandbox_id)


def _snapshot_routes(router: APIRouter, agent: Agent) -> None:
    @router.post("/sandboxes/{sandbox_id}/snapshots")
    async def snapshot(sandbox_id: str, body: m.SnapshotRequest) -> m.SnapshotInfo:
        return await agent.snapshot(sandbox_id, body)

    @router.post("/sandboxes/{sandbox_id}/fork")
    async def fork(sandbox_id: str, body: m.ForkRequest) -> m.SandboxInfo:
        return await agent.fork(sandbox_id, body)

    @router.post("/sandboxes/{sandbox_id}/fork-tree")
    async def fork_tree(sandbox_id: str, body: m.TreeRequest) -> m.TreeResult:
        return await agent.fork_tree(sandbox_id, body)

    @router.post("/snapshots/prune")
    async def prune_snapshots(body: PruneBody) -> PruneResult:
        return PruneResult(removed=await agent.prune_snapshots(body.keep))

    @router.post("/snapshots/{snapshot_id}/store")
    async def store_snapshot(snapshot_id: str) -> m.StoredSnapshot:
        return await agent.store_snapshot(snapshot_id)

    @router.delete("/snapshots/{snapshot_id}", status_code=204)
    async def delete_snapshot(snapshot_id: str, from_store: bool = Query(False)) -> Response:
        await agent.delete_snapshot(snapshot_id, from_store=from_store)
        return _no_content()

    @router.get("/snapshots/{snapshot_id}/evidence")
    async def evidence_list(snapshot_id: str) -> list[m.EvidenceEntry]:
        return await agent.evidence_list(snapshot_id)


def create_agent_app(agent: Agent, token: str, *, metrics_text: MetricsText | None = None) -> FastAPI:
    """The agent's HTTP API for ``agent``, accepting requests that carry ``token``.

    ``metrics_text``, if given, produces the body of ``GET /agent/v1/metrics`` instead of
    ``agent.metrics_text()`` (e.g. the agent process's whole Prometheus registry).
    """
    if not token or token != token.strip():
        raise InvalidArgument("the agent's node token must be a non-empty string without surrounding whitespace")
    app = FastAPI(title="cryobox agent", docs_url=None, redoc_url=None, openapi_url=None)
    router = APIRouter(prefix=PREFIX, route_class=_AgentRoute)
    _host_routes(router, agent, metrics_text)
    _sandbox_routes(router, agent)
    _snapshot_routes(router, agent)
    add_stream_routes(router, agent)
    add_proc_routes(router, agent)
    app.include_router(router)
    add_port_routes(app, agent, token=token)
    _install_error_handlers(app)
    app.add_middleware(AgentGuard, token=token)
    return app


__all__ = ["HEALTHZ", "MAX_BODY_BYTES", "PREFIX", "AgentGuard", "create_agent_app"]
