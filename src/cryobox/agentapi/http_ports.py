"""A host agent's port route: ``/agent/v1/sandboxes/{id}/ports/{port}/{path}`` (every HTTP method and WebSocket),
the far end of :meth:`~.http_client.HttpAgent.port_target`. The control plane forwards a client's request here
with the node token; this proxies it again, to ``agent.port_target()`` (the guest's slot address), with the token
stripped and the control plane's ``X-Forwarded-*`` kept.

The node token is checked here too, in constant time, for HTTP and WebSocket alike (the app's middleware guards
HTTP only). Errors before the proxy starts are answered here in the wire shape (a WebSocket's as the answer to
its handshake).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast
from urllib.parse import unquote

from fastapi import APIRouter, FastAPI
from starlette.types import Receive, Scope, Send

from ..errors import CryoboxError, InvalidArgument, Unauthorized
from ..proxy import PortProxy, parse_port, reply_error, route_suffix
from .interface import Agent

PREFIX = "/agent/v1"
PORT_ROUTE = PREFIX + "/sandboxes/{sandbox_id}/ports/{port}"
PREFIX_SEGMENTS = 6
"""``agent``, ``v1``, ``sandboxes``, the id, ``ports``, the port: what follows is the guest's path."""


def _authorized(scope: Scope, token: bytes) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credential = bytes(value).partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), token)
    return False


class AgentPortEndpoint:
    """The ASGI endpoint of the agent's port routes."""

    def __init__(self, agent: Agent, proxy: PortProxy, token: str | None) -> None:
        self.agent = agent
        self.proxy = proxy
        self._token = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if self._token is not None and not _authorized(scope, self._token):
                raise Unauthorized("missing or invalid agent token")
            params = scope.get("path_params", {})
            port = parse_port(str(params.get("port", "")))
            path = route_suffix(scope, PREFIX_SEGMENTS)
            if unquote(path) != "/" + str(params.get("path", "")):
                raise InvalidArgument("ambiguous percent-encoding in the sandbox id or port")
            sandbox_id = str(params["sandbox_id"])
            target = await self.agent.port_target(sandbox_id, port)
            policy = (await self.agent.get(sandbox_id)).egress  # this hop sends the masked Host too (a fleet)
        except CryoboxError as error:
            await reply_error(scope, send, error)
            return
        host = policy.request_host(port) if policy is not None else None
        await self.proxy.forward(scope, receive, send, target, path, trust_forwarded=True, port=port, host=host)


def add_port_routes(app: FastAPI, agent: Agent, proxy: PortProxy | None = None, *, token: str | None = None) -> None:
    """Serve ``agent``'s ports on ``app`` through ``proxy`` (a new one if None); the app closes the proxy at its
    shutdown. ``token``: the node token, checked by the route itself (WebSockets included)."""
    used = proxy if proxy is not None else PortProxy()

    @asynccontextmanager
    async def closing(_: object) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await used.aclose()

    router = APIRouter(lifespan=closing)
    endpoint = cast(Any, AgentPortEndpoint(agent, used, token))  # an ASGI app, called with (scope, receive, send)
    for tail in ("", "/{path:path}"):
        router.add_route(PORT_ROUTE + tail, endpoint, methods=None, include_in_schema=False)
        router.add_websocket_route(PORT_ROUTE + tail, endpoint)
    app.include_router(router)


__all__ = ["PORT_ROUTE", "AgentPortEndpoint", "add_port_routes"]
