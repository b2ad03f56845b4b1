"""WebSocket through the port proxy, with the ``websockets`` client upstream.

The client is accepted only once the upstream handshake succeeded, with the subprotocol the upstream chose
(and its other response headers, e.g. ``Set-Cookie``). Refused upstream: an HTTP answer other than 101 is
relayed as the handshake's answer (status, headers, body: a nested hop's ``port_unreachable`` stays intact),
and no connection at all is a 502 ``port_unreachable`` — both as an HTTP response when the ASGI server supports
``websocket.http.response``, else the client is accepted and closed with 1011. Then text and binary messages
are relayed both ways concurrently (at most 16 MiB each from the upstream; the ASGI server limits the client's),
pings are answered by each side's library, and a close on either side is passed on with its code and reason
(codes that cannot be sent in a close frame become 1000 for "no status" and 1011, or 1001 towards the
upstream, for an abnormal end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.datastructures import Headers as WsHeaders
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import EXTERNAL_CLOSE_CODES
from websockets.typing import Subprotocol

from .headers import Headers, RawHeaders, response_headers
from .http import unreachable
from .replies import can_deny, close_reason, reply_error, send_response

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 << 20
HANDSHAKE_TIMEOUT_S = 10.0
"""TCP connect plus the upstream's handshake answer."""
CLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class _Closed:
    """How one side ended: its close code and reason (``code`` None: the connection just vanished)."""

    code: int | None
    reason: str = ""


def _sendable(code: int | None, *, abnormal: int) -> int:
    if code is None or code == 1006:
        return abnormal
    if code == 1005:
        return 1000
    return code if code in EXTERNAL_CLOSE_CODES or 3000 <= code < 5000 else abnormal


def _raw(headers: WsHeaders) -> RawHeaders:
    """``websockets`` decodes header bytes as ASCII with surrogate escapes: this gives the bytes back."""
    return [
        (n.encode("latin-1", "surrogateescape"), v.encode("latin-1", "surrogateescape")) for n, v in headers.raw_items()
    ]


async def _connect(
    scope: Scope, send: Send, url: str, headers: Headers, port: int, timeout_s: float
) -> ClientConnection | None:
    agent = next((value for name, value in headers if name == "user-agent"), None)
    others = [(name, value) for name, value in headers if name != "user-agent"]
    offered = [Subprotocol(str(p)) for p in scope.get("subprotocols") or ()]
    try:
        return await connect(
            url,
            additional_headers=others,
            user_agent_header=agent,
            subprotocols=offered or None,
            compression=None,
            proxy=None,
            open_timeout=timeout_s,
            close_timeout=CLOSE_TIMEOUT_S,
            max_size=MAX_MESSAGE_BYTES,
        )
    except InvalidStatus as refused:
        answer = refused.response
        log.info("upstream %s refused the websocket: HTTP %d", url, answer.status_code)
        if can_deny(scope):
            kept = [(n, v) for n, v in response_headers(_raw(answer.headers)) if n != b"content-length"]
            body = bytes(answer.body or b"")
            kept.append((b"content-length", str(len(body)).encode()))
            await send_response(scope, send, answer.status_code, kept, body)
        else:
            await send({"type": "websocket.accept"})
            reason = close_reason(f"upstream answered HTTP {answer.status_code}")
            await send({"type": "websocket.close", "code": 1011, "reason": reason})
    except TimeoutError:
        await reply_error(scope, send, unreachable(port, "the websocket handshake timed out"))
    except (OSError, InvalidHandshake, InvalidURI) as error:
        log.info("upstream %s unreachable: %r", url, error)
        await reply_error(scope, send, unreachable(port, "nothing accepted a websocket connection"))
    return None


async def _client_to_upstream(receive: Receive, upstream: ClientConnection) -> _Closed | None:
    """Relays until the client leaves (its close) or the upstream is gone (None)."""
    while True:
        message = await receive()
        kind = message["type"]
        try:
            if kind == "websocket.receive":
                data: bytes | None = message.get("bytes")
                text: str | None = message.get("text")
                if data is not None:
                    await upstream.send(data)
                elif text is not None:
                    await upstream.send(text)
            elif kind == "websocket.disconnect":
                return _Closed(int(message.get("code", 1005)), str(message.get("reason") or ""))
        except ConnectionClosed:
            return None


async def _upstream_to_client(upstream: ClientConnection, send: Send) -> _Closed | None:
    """Relays until the upstream closes (its close) or the client is gone (None)."""
    try:
        async for data in upstream:
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass
    except OSError:  # the ASGI server's "client disconnected"
        return None
    return _Closed(upstream.close_code, upstream.close_reason or "")


async def _relay(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    inbound = asyncio.create_task(_client_to_upstream(receive, upstream), name="proxy-ws-in")
    outbound = asyncio.create_task(_upstream_to_client(upstream, send), name="proxy-ws-out")
    try:
        done, _ = await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
        client_closed = inbound.result() if inbound in done else None
        if client_closed is not None:  # the client left: close the upstream with its code
            code = _sendable(client_closed.code, abnormal=1001)
            await upstream.close(code, close_reason(client_closed.reason))
            return
        upstream_closed = await outbound  # the upstream is closing (or the client went while sending)
        if upstream_closed is None:
            await upstream.close(1001)
            return
        code = _sendable(upstream_closed.code, abnormal=1011)
        with contextlib.suppress(OSError):
            await send({"type": "websocket.close", "code": code, "reason": close_reason(upstream_closed.reason)})
    finally:
        for task in (inbound, outbound):
            task.cancel()
        for task in (inbound, outbound):
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, OSError):
                await task


async def forward_websocket(
    scope: Scope,
    receive: Receive,
    send: Send,
    url: str,
    headers: Headers,
    *,
    port: int,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
) -> None:
    """Connect to ``url`` (``ws(s)://``) with ``headers``, then accept the client and relay (see the module)."""
    upstream = await _connect(scope, send, url, headers, port, handshake_timeout_s)
    if upstream is None:
        return
    try:
        handshake = upstream.response.headers if upstream.response is not None else WsHeaders()
        accept_headers = response_headers(_raw(handshake), websocket_accept=True)
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol, "headers": accept_headers})
        await _relay(receive, send, upstream)
    finally:
        await upstream.close()


__all__ = ["MAX_MESSAGE_BYTES", "forward_websocket"]
