"""HTTP through the port proxy: the request body streamed upstream as it arrives, the response streamed back
chunk by chunk as the upstream sends it (bytes as they came: no decoding, so ``Content-Encoding`` and
``Content-Length`` stay true), an SSE or chunked response arriving incrementally.

Failures before the response started are answered here in the wire shape: nothing accepted the connection
(refused, nothing listening, connect timeout) or it closed without answering → 502 ``port_unreachable``
("port is not open"); no response headers within the idle timeout → 504 ``timeout``; the connection pool
exhausted → 503 ``capacity``. A failure after the response started cuts the client's connection without
completing the response (so a truncated body never looks whole). A client that goes away mid-response closes
the upstream request at once (an idle event stream included).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from starlette.types import Receive, Scope, Send

from ..errors import CryoboxError, HostUnavailable, PortUnreachable, SandboxTimeout
from .headers import Headers, response_headers
from .replies import reply_error

log = logging.getLogger(__name__)


class _ClientGone(Exception):
    """The client disconnected while its request body was being read."""


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            return bytes(value).strip() not in (b"", b"0")
    return False


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (whatever body is still unread is skipped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def unreachable(port: int, reason: str) -> PortUnreachable:
    return PortUnreachable(f"port is not open: {reason} (port {port})", details={"port": port})


def _failure(error: httpx.TransportError, port: int) -> CryoboxError:
    if isinstance(error, httpx.PoolTimeout):
        return HostUnavailable("too many proxied connections at once; retry", retry_after_s=1.0)
    if isinstance(error, httpx.ConnectTimeout):
        return unreachable(port, "the connection to the sandbox timed out")
    if isinstance(error, httpx.ConnectError):
        return unreachable(port, "nothing accepted a connection")
    if isinstance(error, httpx.TimeoutException):
        return SandboxTimeout(f"port {port} did not answer in time", details={"port": port})
    return unreachable(port, "the connection closed before an answer")


async def _pump(response: httpx.Response, send: Send) -> bool:
    """Relay the body; False if the upstream failed before its end."""
    try:
        async for chunk in response.aiter_raw():
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.TransportError as error:
        log.warning("proxied response from %s broke off: %r", response.request.url, error)
        return False
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


async def forward_http(
    scope: Scope, receive: Receive, send: Send, url: str, headers: Headers, *, client: httpx.AsyncClient, port: int
) -> None:
    """Send the request in ``scope`` to ``url`` with ``headers`` and relay the answer (see the module)."""
    content = _request_body(receive) if _has_body(scope) else None
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]  # bytes as they came
    request = httpx.Request(str(scope["method"]), url, headers=raw, content=content)
    try:
        response = await client.send(request, stream=True, follow_redirects=False)
    except _ClientGone:
        return
    except httpx.TransportError as error:
        await reply_error(scope, send, _failure(error, port))
        return
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response_headers(response.headers.raw),
            }
        )
        gone = asyncio.create_task(_disconnected(receive), name="proxy-disconnect")
        pump = asyncio.create_task(_pump(response, send), name="proxy-response")
        try:
            await asyncio.wait({gone, pump}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (gone, pump):
                task.cancel()
            for task in (gone, pump):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # a False pump (the upstream broke off) returns without completing: the server cuts the connection
    finally:
        await response.aclose()


__all__ = ["forward_http", "unreachable"]
