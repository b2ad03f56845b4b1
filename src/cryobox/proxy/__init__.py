"""The port proxy: a server a sandbox runs on any TCP port, reachable from outside, HTTP and WebSocket, streamed
both ways. :func:`forward` is the ASGI-level engine (a scope in, the upstream's answer out); :class:`PortProxy`
owns the HTTP client it uses. The routes in ``server/routes/ports.py`` (control plane) and
``agentapi/http_ports.py`` (a host agent) resolve the :class:`~.target.PortTarget` and
call it.

Modules: :mod:`.headers` (what crosses, both ways), :mod:`.urls` (the upstream URL, and a route's path
suffix), :mod:`.http`, :mod:`.websocket`, :mod:`.replies` (error answers for both kinds of scope).
"""

from __future__ import annotations

from collections.abc import Collection
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx
from starlette.types import Receive, Scope, Send

from ..errors import CryoboxError, InvalidArgument
from ..util.tls import default_tls_context
from .headers import CREDENTIALS, HOP_BY_HOP, request_headers
from .http import forward_http
from .replies import reply_error
from .target import PortTarget
from .urls import route_suffix, upstream_url
from .websocket import HANDSHAKE_TIMEOUT_S, MAX_MESSAGE_BYTES, forward_websocket

CONNECT_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 300.0
"""No total timeout on a stream: only this long without a byte either way (or without response headers)."""
MAX_CONNECTIONS = 1024
MAX_KEEPALIVE = 128
KEEPALIVE_EXPIRY_S = 4.0
"""Under the common 5 s keep-alive of guest servers (Node's), so a pooled connection is rarely reused just as the
upstream closes it."""


def _port_of(target: PortTarget) -> int:
    url = httpx.URL(target.url)
    return url.port or (443 if url.scheme == "https" else 80)


async def forward(
    scope: Scope,
    receive: Receive,
    send: Send,
    target: PortTarget,
    path: str,
    *,
    client: httpx.AsyncClient,
    strip: Collection[str] = (),
    trust_forwarded: bool = False,
    port: int | None = None,
    host: str | None = None,
) -> None:
    """Forward the HTTP request or WebSocket in ``scope`` to ``target.url`` + ``path`` (percent-encoded, starting
    with ``/``; the query string is the scope's) and relay the answer.

    Credentials are stripped (``Authorization``, ``X-API-Key``, ``X-Access-Token``, ``E2b-Traffic-Access-Token``,
    ``Proxy-Authorization``, and every header and cookie named in ``strip``), then ``target.headers`` added.
    ``trust_forwarded``: keep the ``X-Forwarded-*`` headers the caller sent (a hop behind another proxy of ours).
    ``port`` names the sandbox port in error messages (default: the target URL's). ``host``: the ``Host`` an HTTP
    request carries upstream (a WebSocket handshake keeps the upstream's own). Every failure is answered here
    (502 ``port_unreachable`` "port is not open" when nothing accepts the connection, 400 for a path that leaves
    the target); nothing is raised for them.
    """
    kind = scope["type"]
    if kind not in ("http", "websocket"):
        raise ValueError(f"cannot proxy a {kind!r} scope")
    websocket = kind == "websocket"
    shown = port if port is not None else _port_of(target)
    try:
        url = upstream_url(target, path, bytes(scope.get("query_string", b"")), websocket=websocket)
    except CryoboxError as error:
        await reply_error(scope, send, error)
        return
    headers = request_headers(
        scope,
        target.headers,
        strip=strip,
        trust_forwarded=trust_forwarded,
        websocket=websocket,
        host=None if websocket else host,
    )
    if websocket:
        await forward_websocket(scope, receive, send, url, headers, port=shown)
    else:
        await forward_http(scope, receive, send, url, headers, client=client, port=shown)


class PortProxy:
    """One HTTP client for every proxied request (no environment proxies or netrc, no redirects followed, no
    cookie jar, no default headers, HTTP/1.1, a large pool); :meth:`aclose` at shutdown."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.client = httpx.AsyncClient(
            verify=default_tls_context(),
            trust_env=False,
            follow_redirects=False,
            http1=True,
            http2=False,
            timeout=httpx.Timeout(connect=connect_timeout_s, read=idle_timeout_s, write=idle_timeout_s, pool=5.0),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=MAX_KEEPALIVE,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # keeps nothing: one client, all callers
            transport=transport,
        )
        self.client.headers.clear()  # no Accept-Encoding or User-Agent of ours: the client's own go upstream

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: PortTarget,
        path: str,
        *,
        strip: Collection[str] = (),
        trust_forwarded: bool = False,
        port: int | None = None,
        host: str | None = None,
    ) -> None:
        """:func:`forward` with this proxy's client."""
        await forward(
            scope,
            receive,
            send,
            target,
            path,
            client=self.client,
            strip=strip,
            trust_forwarded=trust_forwarded,
            port=port,
            host=host,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


def parse_port(text: str) -> int:
    """A port from a URL segment: 1-65535 (``InvalidArgument`` otherwise)."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidArgument(f"port must be 1-65535, got {text!r}", details={"port": text})
    return int(text)


__all__ = [
    "CREDENTIALS",
    "HANDSHAKE_TIMEOUT_S",
    "HOP_BY_HOP",
    "MAX_MESSAGE_BYTES",
    "PortProxy",
    "PortTarget",
    "forward",
    "parse_port",
    "reply_error",
    "route_suffix",
]
