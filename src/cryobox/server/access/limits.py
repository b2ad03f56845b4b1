"""Request-size limit as pure ASGI middleware: bodies past the limit get 413 before the app reads them all.

Routes that cap their own bodies while they stream them to disk (a template build's image archive, up to
gigabytes) are named in ``own_limits`` and left to do so."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The largest legitimate body: a 64 MiB file upload (PUT /fs) or exec stdin, plus JSON/base64 slack.
MAX_BODY_BYTES = 96 << 20


class BodyTooLarge(Exception):
    pass


def _413(limit: int) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps(
        {"error": f"request body exceeds {limit} bytes", "code": "payload_too_large", "details": {"limit": limit}}
    ).encode()
    return body, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, own_limits: frozenset[tuple[str, str]] = frozenset()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.own_limits = own_limits
        """``(method, path)`` of the routes that enforce a limit of their own as they read."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope.get("method", ""), scope.get("path", "")) in self.own_limits:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._reject(send)
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body, headers = _413(self.max_bytes)
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
