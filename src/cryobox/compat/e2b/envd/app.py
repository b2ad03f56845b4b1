"""The E2B sandbox URL (``E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox``) as one ASGI app.

The SDK sends every sandbox call to that one URL and says where it is going in headers: ``E2b-Sandbox-Id``,
``E2b-Sandbox-Port`` and, for envd, ``X-Access-Token``. On envd's port (49983) this app *is* envd: the Connect
services (``/process.Process/*``, ``/filesystem.Filesystem/*``, JSON or binary, unary and streams) and the REST
routes (``/files``, ``/health``); every call is checked against the sandbox's access token before its agent is
touched. Any other port goes to the injected :class:`Forward` (the reverse proxy into the guest) with the
sandbox's agent, once the token (``X-Access-Token``, else ``E2b-Traffic-Access-Token``) checks out, or without
one when the sandbox's policy makes its ports public (``public_traffic``).

``/files`` at the control plane's root is envd's file route too (:meth:`EnvdApp.files_at_root`): the SDK's
``download_url``/``upload_url`` join ``/files`` onto the sandbox URL with ``urljoin``, which drops its path, so with
``E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox`` the signed URLs it hands out are ``http://HOST:PORT/files?…``.

Mounted (Starlette ``Mount``) the scope's ``path`` may still carry the mount's prefix, with ``root_path`` naming
it; both that and a bare ``path`` below the prefix work, and so does ``prefix`` itself when nothing set
``root_path``. ``Mount`` does not pass lifespan events on: whoever mounts the app calls :meth:`EnvdApp.aclose` at
shutdown (it forgets the pending deadline kills of ``Start`` calls).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

from starlette.types import Receive, Scope, Send

from ....agentapi.interface import MAX_FILE_BYTES, Agent
from ....errors import InvalidArgument
from ....server.control.network import request_host
from ..access import PORT_HEADER, SANDBOX_HEADER, TOKEN_HEADER, TRAFFIC_TOKEN_HEADER
from .errors import ErrorInterceptor
from .files import EnvdFiles, header_map, send_error
from .filesystem import FilesystemService
from .gen.filesystem.filesystem_connect import FilesystemASGIApplication
from .gen.process.process_connect import ProcessASGIApplication
from .process import ProcessService, Sleep
from .session import DEFAULT_USER, SandboxOpener, open_sandbox

ENVD_PORT = 49983
MOUNT_PREFIX = "/e2b/sandbox"
FILES_ROUTE = "/files"
RPC_READ_MAX_BYTES = 16 << 20
"""Largest Connect request message (a ``SendInput`` of ~12 MiB of stdin, base64 in JSON)."""
WS_POLICY_VIOLATION = 1008


class Forward(Protocol):
    """Serve one HTTP or WebSocket request for guest ``port`` of ``sandbox_id`` (already authorized) through
    ``agent`` (e.g. to :meth:`~cryobox.agentapi.interface.Agent.port_target`)."""

    def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        agent: Agent,
        sandbox_id: str,
        port: int,
        *,
        host: str | None = None,
    ) -> Awaitable[None]:
        """``scope`` is the request's, with ``path``/``raw_path`` below the mount (the guest's path) and an empty
        ``root_path``; its headers still carry the ``E2b-*`` and ``X-Access-Token`` ones. ``host``: the ``Host``
        the guest is to see (the sandbox policy's ``mask_request_host``), if any."""
        ...


def route_path(scope: Scope, prefix: str = MOUNT_PREFIX) -> str:
    """The request's path below the mount (``/files``, ``/process.Process/Start``)."""
    path: str = scope.get("path", "") or "/"
    for root in (scope.get("root_path", ""), prefix):
        if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
            return path[len(root) :] or "/"
    return path


def below_mount(scope: Scope, prefix: str = MOUNT_PREFIX) -> Scope:
    """``scope`` as if the app ran at the root: ``path`` (and ``raw_path``) below the mount, no ``root_path``."""
    route = route_path(scope, prefix)
    path: str = scope.get("path", "") or "/"
    raw: bytes | None = scope.get("raw_path")
    mount = path[: len(path) - len(route)].encode() if route != path and path.endswith(route) else b""
    if raw is None or (mount and not raw.startswith(mount)):
        raw = route.encode()
    elif mount:
        raw = raw[len(mount) :] or b"/"
    return {**scope, "path": route, "raw_path": raw, "root_path": ""}


def sandbox_port(headers: dict[str, str]) -> int:
    raw = headers.get(PORT_HEADER)
    if raw is None:
        return ENVD_PORT
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 65535:
        raise InvalidArgument(f"invalid {PORT_HEADER} header {raw[:16]!r}")
    return int(raw)


class EnvdApp:
    def __init__(
        self,
        access: SandboxOpener,
        forward: Forward,
        *,
        prefix: str = MOUNT_PREFIX,
        default_user: str = DEFAULT_USER,
        sleep: Sleep = asyncio.sleep,
        max_file_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        self._access = access
        self._forward = forward
        self._prefix = prefix.rstrip("/")
        self.process = ProcessService(access, default_user=default_user, sleep=sleep)
        self.filesystem = FilesystemService(access, default_user=default_user)
        interceptors = (ErrorInterceptor(),)
        self._rpc = (
            (
                "/process.Process/",
                ProcessASGIApplication(self.process, interceptors=interceptors, read_max_bytes=RPC_READ_MAX_BYTES),
            ),
            (
                "/filesystem.Filesystem/",
                FilesystemASGIApplication(
                    self.filesystem, interceptors=interceptors, read_max_bytes=RPC_READ_MAX_BYTES
                ),
            ),
        )
        self._files = EnvdFiles(access, default_user=default_user, max_file_bytes=max_file_bytes)

    async def aclose(self) -> None:
        await self.process.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        headers = header_map(scope)
        try:
            port = sandbox_port(headers)
        except InvalidArgument as exc:
            await self._refuse(scope, send, exc)
            return
        if port != ENVD_PORT:
            await self._forward_port(scope, receive, send, headers, port)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})
            return
        inner = below_mount(scope, self._prefix)
        for prefix, app in self._rpc:
            if inner["path"].startswith(prefix):
                await app(inner, receive, send)
                return
        await self._files(inner, receive, send, inner["path"])

    async def files_at_root(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/files`` outside the mount: envd's file route whatever ``E2b-Sandbox-Port`` says (a URL the SDK built)."""
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})
            return
        await self._files({**scope, "root_path": ""}, receive, send, FILES_ROUTE)

    async def _forward_port(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], port: int
    ) -> None:
        sandbox_id = headers.get(SANDBOX_HEADER)
        token = headers.get(TOKEN_HEADER) or headers.get(TRAFFIC_TOKEN_HEADER)
        try:
            row, agent = await open_sandbox(self._access, sandbox_id, token, traffic=True)
        except Exception as exc:
            await self._refuse(scope, send, exc)
            return
        host = request_host(row.egress, port)
        await self._forward(below_mount(scope, self._prefix), receive, send, agent, str(sandbox_id), port, host=host)

    async def _refuse(self, scope: Scope, send: Send, exc: Exception) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})
        else:
            await send_error(send, exc)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_envd_app(
    access: SandboxOpener,
    forward: Forward,
    *,
    prefix: str = MOUNT_PREFIX,
    default_user: str = DEFAULT_USER,
    sleep: Sleep = asyncio.sleep,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> EnvdApp:
    """The app to mount at ``prefix`` (``/e2b/sandbox``) of the control plane."""
    return EnvdApp(
        access, forward, prefix=prefix, default_user=default_user, sleep=sleep, max_file_bytes=max_file_bytes
    )
