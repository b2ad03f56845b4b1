"""Error answers of the port proxy, in the wire shape ``{"error", "code", "details"}``, for both kinds of scope.

An HTTP request gets a JSON response with the error's status (``Retry-After`` for the retryable ones). A
WebSocket not yet accepted is refused with the same HTTP response when the ASGI server supports the
``websocket.http.response`` extension (uvicorn's implementations do); otherwise it is accepted and closed at
once, with ``1011`` for a server-side failure (5xx) and ``4000 + status`` for the caller's (like the terminal
route), the error's code as the reason.
"""

from __future__ import annotations

import json
import math

from starlette.types import Scope, Send

from ..errors import CryoboxError, HostUnavailable, QuotaExceeded
from .headers import RawHeaders

DENIAL_EXTENSION = "websocket.http.response"
MAX_CLOSE_REASON_BYTES = 123


def close_reason(text: str) -> str:
    """``text`` cut to what a close frame can carry (123 bytes of UTF-8)."""
    data = text.encode()[:MAX_CLOSE_REASON_BYTES]
    return data.decode(errors="ignore")


def can_deny(scope: Scope) -> bool:
    return DENIAL_EXTENSION in (scope.get("extensions") or {})


def error_parts(error: CryoboxError) -> tuple[int, RawHeaders, bytes]:
    body = json.dumps(error.to_wire()).encode()
    headers: RawHeaders = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if isinstance(error, HostUnavailable | QuotaExceeded):
        headers.append((b"retry-after", str(max(1, math.ceil(error.retry_after_s))).encode()))
    if error.http_status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return error.http_status, headers, body


async def send_response(scope: Scope, send: Send, status: int, headers: RawHeaders, body: bytes) -> None:
    """A whole HTTP response: a plain one, or a WebSocket denial (the extension must be supported)."""
    kind = "http.response" if scope["type"] == "http" else "websocket.http.response"
    await send({"type": f"{kind}.start", "status": status, "headers": headers})
    await send({"type": f"{kind}.body", "body": body, "more_body": False})


async def reply_error(scope: Scope, send: Send, error: CryoboxError) -> None:
    """Answer a request (or refuse a WebSocket not yet accepted) with ``error``."""
    if scope["type"] == "http" or can_deny(scope):
        status, headers, body = error_parts(error)
        await send_response(scope, send, status, headers, body)
        return
    code = 1011 if error.http_status >= 500 else 4000 + error.http_status
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": close_reason(f"{error.code}: {error.message}")})


__all__ = ["can_deny", "close_reason", "reply_error", "send_response"]
