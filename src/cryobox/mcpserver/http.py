"""``/mcp``: the MCP server over streamable HTTP on the control plane app (stateless, JSON responses).

The API's gate (:class:`~cryobox.server.access.gate.AuthGateMiddleware`) has authenticated the request before it gets
here: no key or a bad one is its 401 in the API's error body, and the MCP body is under its 1 MiB JSON cap. A key
in the query string is refused here too (401), as the terminal websocket refuses one. A tool call then makes
ordinary API requests to the same app, in process (``httpx.ASGITransport``), with the caller's key and client
address: they pass the gate, the metrics, the body limits, the route's own authentication, workspace scoping,
quotas and the per-workspace rate limit exactly as the caller's own requests would.

The SDK's session manager runs a task group that must live inside the app's lifespan: :meth:`McpEndpoint.run`
is entered there; outside of it the endpoint answers 503. The SDK (0.3 s of imports) is loaded, and the manager
started in a task of that lifespan, by the first request to ``/mcp``: a restarting server does not wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import CryoboxError, HostUnavailable, Unauthorized
from ..sdk._base import CONNECT_TIMEOUT_S
from ..server.access.gate import bearer

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from .tools import ApiBinding

PATH = "/mcp"
URL_KEY_PARAMS = frozenset({"api_key", "apikey", "key", "token", "access_token"})
TOOL_TIMEOUT_S = 300.0


def _client_address(request: Request) -> tuple[str, int]:
    return (request.client.host, request.client.port) if request.client else ("127.0.0.1", 0)


class McpEndpoint:
    """The ASGI app mounted at ``/mcp``; ``target`` is the control plane app its tools call."""

    def __init__(self, target: ASGIApp) -> None:
        self.target = target
        self._running: asyncio.Event | None = None  # set while a lifespan holds run(); cleared as it ends
        self._manager: StreamableHTTPSessionManager | None = None
        self._starting: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The endpoint serves while this is entered; the manager (started by the first request) stops with it."""
        self._running, self._starting = asyncio.Event(), asyncio.Lock()
        self._running.set()
        try:
            yield
        finally:
            self._running.clear()
            task, self._task, self._manager = self._task, None, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._running = self._starting = None

    async def _started(self) -> StreamableHTTPSessionManager | None:
        """The session manager, started on first use inside :meth:`run`; None outside of it."""
        if self._manager is not None or self._running is None or self._starting is None:
            return self._manager
        async with self._starting:
            if self._manager is None and self._running.is_set():
                from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

                from .server import build_server

                manager = StreamableHTTPSessionManager(build_server(self.binding), json_response=True, stateless=True)
                up = asyncio.Event()

                async def hold() -> None:
                    try:
                        async with manager.run():
                            up.set()
                            await asyncio.Event().wait()  # until run() ends and cancels this
                    finally:
                        up.set()  # a manager that failed to start wakes its starter too

                task = self._task = asyncio.get_running_loop().create_task(hold(), name="mcp session manager")
                await up.wait()
                if task.done():
                    self._task = None
                    task.result()  # its error, to this request (the next one tries again)
                self._manager = manager
        return self._manager

    def binding(self, request: Any) -> ApiBinding:
        """The API as the caller of ``request`` (the HTTP request an MCP message came in) sees it."""
        from .tools import ApiBinding

        if not isinstance(request, Request):
            raise Unauthorized("no HTTP request to take the API key from")
        key = bearer(request.scope.get("headers", []))
        if key is None:  # the gate lets nothing without a key through; never call the API without one
            raise Unauthorized("missing bearer API key (Authorization: Bearer <key>)")
        base = f"{request.url.scheme}://{request.url.netloc}"
        address = _client_address(request)

        def open_client() -> httpx.AsyncClient:
            transport = httpx.ASGITransport(app=self.target, client=address, raise_app_exceptions=False)
            return httpx.AsyncClient(
                transport=transport,
                base_url=base,
                headers={"Authorization": f"Bearer {key}", "User-Agent": "cryobox-mcp"},
                timeout=httpx.Timeout(TOOL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            )

        return ApiBinding(api_url=base, api_key=key, open_client=open_client)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        if URL_KEY_PARAMS & {name.lower() for name in request.query_params}:
            await _refuse(send, Unauthorized("API keys in the URL are refused; send Authorization: Bearer <key>"))
            return
        manager = await self._started()
        if manager is None:
            await _refuse(send, HostUnavailable("the MCP endpoint is not running (the app is starting or stopping)"))
            return
        await manager.handle_request(scope, receive, send)


class McpRoute(Route):
    """The route of ``/mcp``. FastAPI's router sets ``scope["route"]`` (the metrics' route label) only for its own
    routes; this plain ASGI route sets it too, so ``/mcp`` is counted as ``/mcp``, not ``unmatched``."""

    def __init__(self, endpoint: McpEndpoint) -> None:
        super().__init__(PATH, endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


async def _refuse(send: Send, err: CryoboxError) -> None:
    body = json.dumps(err.to_wire()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if err.http_status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
