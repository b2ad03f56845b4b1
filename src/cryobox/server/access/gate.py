"""The API's front gate, as pure ASGI middleware: a request's key is checked before its body is read, JSON
bodies are capped at 1 MiB (file uploads keep the large limit of :mod:`.limits`), and a client address that
keeps presenting bad keys is refused for a while.

FastAPI reads and parses a JSON body before it resolves a route's dependencies, so authentication in a
dependency alone lets anyone make the server parse megabytes; here nothing is read until the key is known.
The route's own dependency still authenticates (from :class:`~.keycache.KeyCache`, so the second look costs
a dictionary lookup).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import CryoboxError
from . import cookies as console_auth
from .sessions import ConsoleSessions

MAX_JSON_BYTES = 1 << 20
PUBLIC_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"})
NODE_PREFIXES = ("/internal/",)
"""Agent-to-control-plane routes: authenticated by the node token in their own dependency."""
SIGNED_PREFIXES = ("/e2b/template-uploads/", "/e2b/volumecontent/")
"""Signed upload URLs (E2B's template files) and E2B's volume content API: the URL's token, or the volume's bearer
token (a 256-bit HMAC of its id: nothing to guess), is the authorization, checked by the route before it reads the
body (which it caps itself)."""
SIGNED_FILE_URL = re.compile(r"^/v1/sandboxes/[^/]+/files/signed$")
"""Signed file URLs (``POST /v1/sandboxes/{id}/files/url``): likewise, the route checks the signature first."""
UPLOAD = re.compile(r"^/v1/(sandboxes/[^/]+/(files|fs|exec|ports|proxy)(/|$)|volumes/[^/]+/files$)")
"""Routes whose bodies are file contents (a sandbox's, a volume's), exec stdin or a guest port's traffic (proxied
as it comes, never parsed): the large limit."""
BUILD_UPLOAD = "/v1/templates/build"
"""A template build's Dockerfile and context: the route caps its body itself (the build context limit)."""
SANDBOX_PREFIX = "/e2b/sandbox"
"""The E2B sandbox URL: authenticated by the sandbox's access token (``X-Access-Token`` with ``E2b-Sandbox-Id``),
not by an API key; its file uploads and port traffic take the large limit, its RPCs the JSON cap. A guest port's
traffic without any token goes on to the app, which serves it only for a sandbox whose policy makes its ports
public (and answers 401 for every other sandbox id, known or not)."""
SANDBOX_UPLOAD = re.compile(r"^/e2b/sandbox/files/?$")
ROOT_FILES = "/files"
"""envd's file route at the root (where the E2B SDK's ``download_url``/``upload_url`` point with a sandbox URL set):
the sandbox URL's rules, and always envd's port."""
SIGNED_FILES = re.compile(r"^(/e2b/sandbox)?/files$")
"""envd's file routes, which also take a signed URL (``signature`` in the query) instead of the access token: such a
request goes on without a token, and the route checks the signature before it reads the body, the registry or the
guest (a 256-bit hash: nothing to guess, so a wrong one is not counted as a bad key)."""
ENVD_PORT = "49983"


@dataclass
class FailedAuth:
    """Bad keys per client address: ``burst`` failures, refilled at ``per_s``; an empty bucket refuses every
    request from that address (429) until it refills. Buckets full again are forgotten."""

    burst: float = 20.0
    per_s: float = 0.2
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _level(self, client: str) -> float:
        tokens, at = self._buckets.get(client, (self.burst, self.clock()))
        return min(self.burst, tokens + (self.clock() - at) * self.per_s)

    def blocked(self, client: str) -> bool:
        return self._level(client) < 1.0

    def failed(self, client: str) -> None:
        self._buckets[client] = (self._level(client) - 1.0, self.clock())
        if len(self._buckets) > 10_000:  # forget addresses whose buckets are full again
            for key in [k for k in self._buckets if self._level(k) >= self.burst]:
                del self._buckets[key]


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header value (the one parser of it)."""
    text = (authorization or "").strip()
    if text.lower().startswith("bearer ") and text[7:].strip():
        return text[7:].strip()
    return None


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            key = bearer_key(value.decode("latin-1"))
            if key is not None:
                return key
        elif name == b"x-api-key" and value.strip():
            return value.decode("latin-1").strip()
    return None


class AuthGateMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        authenticate: Callable[[str], Awaitable[object | None]],
        failures: FailedAuth | None = None,
        max_json_bytes: int = MAX_JSON_BYTES,
        sandbox_token: Callable[..., bool] | None = None,
        sessions: ConsoleSessions | None = None,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.sandbox_token = sandbox_token
        self.sessions = sessions
        self.failures = failures if failures is not None else FailedAuth()
        self.max_json_bytes = max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if (
            scope["type"] != "http"
            or path in PUBLIC_PATHS
            or path.startswith(NODE_PREFIXES + SIGNED_PREFIXES)
            or SIGNED_FILE_URL.match(path)
        ):
            await self.app(scope, receive, send)
            return
        if console_auth.is_console_asset(path):  # the console's static files: no data in them
            await self.app(scope, receive, send)
            return
        client = scope["client"][0] if scope.get("client") else "-"
        if self.failures.blocked(client):
            await _reply(
                send, 429, "auth_rate_limited", "too many requests with bad API keys from this address", path=path
            )
            return
        if path == SANDBOX_PREFIX or path.startswith(SANDBOX_PREFIX + "/") or path == ROOT_FILES:
            await self._sandbox(scope, receive, send, client)
            return
        if path in (console_auth.LOGIN_PATH, console_auth.LOGOUT_PATH):  # they check the key or cookie themselves
            await self._capped(scope, receive, send)
            return
        key = bearer(scope.get("headers", []))
        if key is None and self.sessions is not None and console_auth.cookie_allowed(path):
            headers = scope.get("headers", [])
            token = console_auth.session_token(console_auth.header(headers, b"cookie"))
            if token is not None:
                await self._cookie(scope, receive, send, token)
                return
        if key is None or await self.authenticate(key) is None:
            self.failures.failed(client)
            missing = "missing bearer API key (Authorization: Bearer <key>)"
            message = missing if key is None else "invalid or revoked API key"
            await _reply(send, 401, "unauthorized", message, path=path)
            return
        if UPLOAD.match(path) or path == BUILD_UPLOAD:
            await self.app(scope, receive, send)
            return
        await self._capped(scope, receive, send)

    async def _cookie(self, scope: Scope, receive: Receive, send: Send, token: str) -> None:
        """A console session instead of a key (not counted as a bad key when stale: a cookie's token is random,
        not guessable, and a browser holding an old one must not lock its address out)."""
        assert self.sessions is not None
        path = str(scope.get("path", ""))
        csrf = console_auth.header(scope.get("headers", []), b"x-csrf-token")
        method = str(scope.get("method", "GET"))
        try:
            await asyncio.to_thread(console_auth.check_session, self.sessions, token, method, csrf)
        except CryoboxError as err:
            await _reply(send, err.http_status, err.code, err.message, path=path)
            return
        if UPLOAD.match(path):
            await self.app(scope, receive, send)
            return
        await self._capped(scope, receive, send)

    async def _sandbox(self, scope: Scope, receive: Receive, send: Send, client: str) -> None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", [])}
        sandbox_id = headers.get("e2b-sandbox-id", "").strip()
        token = headers.get("x-access-token", "").strip() or headers.get("e2b-traffic-access-token", "").strip()
        port = headers.get("e2b-sandbox-port", "").strip()
        path = str(scope.get("path", ""))
        # a guest port's traffic: the traffic token will do (never on /files at the root: envd's whatever the port)
        traffic = bool(port) and port != ENVD_PORT and path != ROOT_FILES
        verify = self.sandbox_token
        if traffic and not token and sandbox_id:  # a public port needs no token: the envd app reads the policy
            await self.app(scope, receive, send)
            return
        if not token and not traffic and sandbox_id and _signed_file(scope, path):
            await self.app(scope, receive, send)  # the file route checks the signature and caps its body
            return
        if verify is None or not sandbox_id or not token or not verify(sandbox_id, token, traffic=traffic):
            self.failures.failed(client)
            message = "missing or invalid sandbox access token (X-Access-Token)"
            await _reply(send, 401, "unauthorized", message, path=path if SIGNED_FILES.match(path) else SANDBOX_PREFIX)
            return
        if SANDBOX_UPLOAD.match(path) or path == ROOT_FILES or traffic:
            await self.app(scope, receive, send)
            return
        await self._capped(scope, receive, send)

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_json_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _too_large(send, limit)
                return
        seen, started = 0, False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracking)
        except _TooLarge:
            if not started:
                await _too_large(send, limit)


class _TooLarge(Exception):
    pass


def _signed_file(scope: Scope, path: str) -> bool:
    """A download or upload on envd's file route that carries a ``signature`` query parameter."""
    if not SIGNED_FILES.match(path) or scope.get("method") not in ("GET", "POST"):
        return False
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    return any(pair.partition("=")[0] == "signature" for pair in query.split("&"))


async def _too_large(send: Send, limit: int) -> None:
    await _reply(send, 413, "payload_too_large", f"request body exceeds {limit} bytes", {"limit": limit})


CONNECT_CODES = {401: "unauthenticated", 413: "resource_exhausted", 429: "resource_exhausted"}


def _body(path: str, status: int, code: str, message: str, details: dict[str, object] | None) -> dict[str, object]:
    """The refusal in the shape the caller's client reads: Connect's on the E2B sandbox URL, E2B's on its API,
    cryobox's everywhere else."""
    if SIGNED_FILES.match(path):  # envd's REST error, as its file routes answer
        return {"code": status, "message": message}
    if path == SANDBOX_PREFIX or path.startswith(SANDBOX_PREFIX + "/"):
        return {"code": CONNECT_CODES.get(status, "unknown"), "message": message}
    if path.startswith("/e2b/"):
        return {"code": status, "message": message}
    return {"error": message, "code": code, "details": details or {}}


async def _reply(
    send: Send, status: int, code: str, message: str, details: dict[str, object] | None = None, *, path: str = ""
) -> None:
    body = json.dumps(_body(path, status, code, message, details)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
