"""A sandbox's ports from outside: ``/v1/sandboxes/{id}/ports/{port}/{path}`` (and the PandaStack-style alias
``/v1/sandboxes/{id}/proxy/{port}/{path}``), every HTTP method and WebSocket, proxied to the server the sandbox
runs on that port (:mod:`cryobox.proxy`): directly to the guest's slot address for the in-process agent, through
the agent's own port route for a remote one.

Authentication is the API key (``Authorization: Bearer <key>``) like every ``/v1`` route, for WebSockets too; it
is consumed here and never reaches the guest. Then the port (1-65535, else 400), the sandbox (404 for another
workspace's; a hibernated one is woken), its agent's :meth:`~cryobox.agentapi.Agent.port_target`, and the
request goes on with the path after the port as the client sent it and the same query string (and, when the
sandbox's policy has a ``mask_request_host``, that ``Host``). Nothing
listening there: 502 ``port_unreachable`` ("port is not open"). A refused WebSocket gets the same answers as
HTTP responses to its handshake.

These routes are raw ASGI (Starlette ``Route``/``WebSocketRoute``), outside the OpenAPI document: the bodies
are the guest's.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote

from fastapi import APIRouter, Request
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from ...errors import CryoboxError, InvalidArgument, Unauthorized
from ...proxy import parse_port, reply_error, route_suffix
from ...proxy.target import PortTarget
from ..access.gate import bearer_key
from ..control.network import request_host
from .deps import AppContext, authenticated

PREFIX_SEGMENTS = 5
"""``v1``, ``sandboxes``, the id, ``ports``/``proxy``, the port: what follows is the guest's path."""
ROUTE_KINDS = ("ports", "proxy")


async def _workspace(scope: Scope, receive: Receive, ctx: AppContext) -> str:
    if scope["type"] == "http":
        return (await authenticated(Request(scope, receive), ctx)).workspace_id
    key = bearer_key(Headers(scope=scope).get("authorization"))
    if key is None:
        raise Unauthorized("missing bearer API key (Authorization: Bearer <key>)")
    workspace = await ctx.keys.check(key)
    if workspace is None:
        raise Unauthorized("invalid or revoked API key")
    ctx.limiter.check(workspace.id)
    return workspace.id


def guest_path(scope: Scope) -> str:
    """The path after the port, percent-encoded as sent (``/`` when none)."""
    suffix = route_suffix(scope, PREFIX_SEGMENTS)
    matched = "/" + str(scope.get("path_params", {}).get("path", ""))
    if unquote(suffix) != matched:  # an encoded '/' before the port: the raw path does not split like the route
        raise InvalidArgument("ambiguous percent-encoding in the sandbox id or port")
    return suffix


async def _resolve(scope: Scope, receive: Receive, ctx: AppContext) -> tuple[PortTarget, int, str, str | None]:
    workspace_id = await _workspace(scope, receive, ctx)
    params = scope.get("path_params", {})
    port = parse_port(str(params.get("port", "")))
    path = guest_path(scope)
    sandbox_id = str(params["sandbox_id"])
    row, agent = await ctx.control.route(sandbox_id, workspace_id)
    return await agent.port_target(sandbox_id, port), port, path, request_host(row.egress, port)


class PortEndpoint:
    """The ASGI endpoint of one port route (``path``, its template). HTTP errors before the proxy starts are
    raised to the app's exception handlers (the usual error bodies); a WebSocket's are answered here (its
    handshake refused)."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # FastAPI names only its own routes in the scope: this one labels the request for the metrics middleware
        scope.setdefault("route", self)
        ctx: AppContext = scope["app"].state.ctx
        if scope["type"] == "http":
            target, port, path, host = await _resolve(scope, receive, ctx)
        else:
            try:
                target, port, path, host = await _resolve(scope, receive, ctx)
            except CryoboxError as error:
                await reply_error(scope, send, error)
                return
        await ctx.proxy.forward(scope, receive, send, target, path, port=port, host=host)


def _routes() -> APIRouter:
    router = APIRouter(tags=["ports"])
    for kind in ROUTE_KINDS:
        for tail in ("", "/{path:path}"):
            path = f"/v1/sandboxes/{{sandbox_id}}/{kind}/{{port}}{tail}"
            endpoint = cast(Any, PortEndpoint(path))  # an ASGI app: Starlette calls it with (scope, receive, send)
            router.add_route(path, endpoint, methods=None, include_in_schema=False)
            router.add_websocket_route(path, endpoint)
    return router


router = _routes()
