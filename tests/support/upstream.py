"""Real servers on 127.0.0.1 around the port proxy (:mod:`cryobox.proxy`), all in the test's event loop: a raw ASGI
upstream on uvicorn that echoes what it got (:class:`Upstream`), a bare app that calls :meth:`PortProxy.forward`
(``/<target>/<path>``), and ``serving``, which runs an ASGI app on uvicorn with its lifespan and WebSockets."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast

import uvicorn
from starlette.types import Receive, Scope, Send
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers as WsHeaders
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse
from websockets.typing import Subprotocol

from cryobox.proxy import PortProxy, route_suffix
from cryobox.proxy.target import PortTarget

ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]


BLOB = bytes(range(256)) * (3 * 4096)  # 3 MiB


class _Server(uvicorn.Server):
    """uvicorn in the test's loop: several run at once, so none may take the process's signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(app: ASGI, *, ws: str = "websockets-sansio") -> AsyncIterator[str]:
    """``app`` on a real uvicorn on 127.0.0.1 in this loop; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        cast(Any, app),
        interface="asgi3",
        log_level="warning",
        lifespan="on",
        ws=ws,
        proxy_headers=False,
        timeout_graceful_shutdown=2,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert not task.done() and time.monotonic() < deadline, "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 15)
        finally:
            sock.close()


async def _lifespan(receive: Receive, send: Send, on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if on_stop is not None:
                await on_stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


@dataclass
class Upstream:
    """The upstream's view: what it was sent, and the handshakes the streaming tests wait on."""

    sse_release: asyncio.Event = field(default_factory=asyncio.Event)
    sse_gone: asyncio.Event = field(default_factory=asyncio.Event)
    upload_started: asyncio.Event = field(default_factory=asyncio.Event)
    uploaded: int = 0
    ws_requests: list[WsHeaders] = field(default_factory=list)
    ws_closed: asyncio.Queue[tuple[int | None, str]] = field(default_factory=asyncio.Queue)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path = bytes(scope["raw_path"]).decode()
        name = path.split("/")[2] if path.count("/") >= 2 else ""
        handler = getattr(self, f"_{name.replace('-', '_')}", None)
        if handler is None:
            await _reply(send, 404, b"no such upstream route")
            return
        await handler(scope, receive, send)

    async def _echo(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read(receive)
        headers = [[bytes(n).decode("latin-1"), bytes(v).decode("latin-1")] for n, v in scope["headers"]]
        answer = {
            "method": scope["method"],
            "raw_path": bytes(scope["raw_path"]).decode(),
            "query": bytes(scope["query_string"]).decode(),
            "headers": headers,
            "length": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
        await _reply(send, 200, json.dumps(answer).encode(), b"application/json")

    async def _mirror(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read(receive)
        status = int(dict(_query(scope)).get("status", "200"))
        extra = [
            (b"x-upstream", b"yes"),
            (b"x-resp-hop", b"secret"),
            (b"connection", b"x-resp-hop"),
            (b"keep-alive", b"timeout=5"),
            (b"set-cookie", b"jar=leak; Path=/"),
        ]
        await _reply(send, status, body, b"application/octet-stream", extra)

    async def _blob(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _reply(send, 200, BLOB, b"application/octet-stream")

    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        digest = hashlib.sha256()
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            digest.update(chunk)
            self.uploaded += len(chunk)
            if chunk:
                self.upload_started.set()
            if not message.get("more_body", False):
                break
        answer = json.dumps({"length": self.uploaded, "sha256": digest.hexdigest()}).encode()
        await _reply(send, 200, answer, b"application/json")

    async def _sse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.sse_release.wait(), 30)  # a buffering proxy keeps "one" until then
        await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": False})

    async def _sse_idle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: hello\n\n", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass
        self.sse_gone.set()

    async def _break(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})
        # returning now: the server cuts the connection 90 bytes short

    async def ws_handler(self, conn: ServerConnection) -> None:
        self.ws_requests.append(conn.request.headers if conn.request is not None else WsHeaders())
        try:
            async for message in conn:
                if message == "die":  # the upstream vanishes: no close frame
                    conn.transport.abort()
                    return
                if isinstance(message, str) and message.startswith("close:"):
                    _, code, reason = message.split(":", 2)
                    await conn.close(int(code), reason)
                    return
                await conn.send(message)
        except ConnectionClosed:
            pass
        finally:
            await self.ws_closed.put((conn.close_code, conn.close_reason or ""))


def ws_gate(conn: ServerConnection, request: WsRequest) -> WsResponse | None:
    if request.path.startswith("/forbidden"):
        return conn.respond(HTTPStatus.FORBIDDEN, "no entry here\n")
    return None


def pick_subprotocol(conn: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    return next((p for p in offered if p in ("chat.v1", "chat.v2")), None)


async def _read(receive: Receive) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


def _query(scope: Scope) -> list[tuple[str, str]]:
    text = bytes(scope["query_string"]).decode()
    return [tuple(part.split("=", 1)) for part in text.split("&") if "=" in part]  # type: ignore[misc]


async def _reply(
    send: Send, status: int, body: bytes, kind: bytes = b"text/plain", extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proxy_app(proxy: PortProxy, targets: dict[str, PortTarget], *, deny: bool = True) -> ASGI:
    """``/<name>/<path>`` to ``targets[name]`` + ``<path>``; ``deny=False`` hides ``websocket.http.response``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, proxy.aclose)
            return
        if not deny:
            scope = {**scope, "extensions": {}}
        name = bytes(scope["raw_path"]).decode().split("/")[1]
        strip = ("session", "X-Custom-Secret")
        await proxy.forward(scope, receive, send, targets[name], route_suffix(scope, 1), strip=strip, port=4242)

    return app
