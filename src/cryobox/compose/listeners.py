"""The API's listeners: plain HTTP (``cryobox serve --port``, ``cryobox control --listen``) and, with an operator's
certificate (``--tls-cert``/``--tls-key``), a second one speaking HTTPS for the same app.

Why two: sandbox hosts (``{port}-{id}.{domain}``) are HTTPS to the E2B SDK, always on 443 (it builds
``https://{port}-{id}.{domain}`` and has no port to add); the plain listener stays what agents' heartbeats, the
local CLI, health checks and a TLS-terminating proxy in front already use, so turning TLS on changes none of them.

The plain listener's server runs the app's lifespan and takes the signals (a graceful stop on SIGTERM); the HTTPS
one starts once the plain one serves and stops when it is told to stop. The certificate is read at start
(restart to use a renewed one).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import uvicorn
from starlette.types import ASGIApp

from ..errors import InvalidArgument
from ..util.tcp import listen_tcp
from .activation import Activation
from .draining import DrainingProtocol
from .parts import GRACEFUL_STOP_S
from .promptserver import PromptServer

HTTPS_PORT = 443
"""Where the E2B SDK sends a sandbox host's traffic, and so the HTTPS listener's default port."""


@dataclass(frozen=True)
class TlsListener:
    host: str
    port: int
    cert: Path
    """The certificate chain (PEM), e.g. a wildcard ``*.{sandbox domain}`` one."""
    key: Path


def tls_listener(cert: Path | None, key: Path | None, host: str, port: int = HTTPS_PORT) -> TlsListener | None:
    """The HTTPS listener the options ask for (None: neither file given), its certificate and key checked now.

    :raises InvalidArgument: one file without the other, unreadable files, or a key that is not the
        certificate's."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidArgument("--tls-cert and --tls-key go together", details={"field": "tls_cert"})
    if not 0 < port < 65536:
        raise InvalidArgument(f"HTTPS port {port} is not a port", details={"field": "https_port"})
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise InvalidArgument(f"cannot use TLS certificate {cert} with key {key}: {err}") from None
    return TlsListener(host=host, port=port, cert=cert, key=key)


def http_server(app: ASGIApp, host: str, port: int) -> PromptServer:
    """The plain listener's server (lifespan on)."""
    return PromptServer(_config(app, host, port, lifespan="on"))


def _config(
    app: ASGIApp, host: str, port: int, *, lifespan: Literal["on", "off"], tls: TlsListener | None = None
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        lifespan=lifespan,
        ws="websockets-sansio",  # the PTY websocket; the legacy implementation is deprecated
        http=DrainingProtocol,  # a graceful stop answers the requests of connections it accepted
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
        ssl_certfile=tls.cert if tls is not None else None,
        ssl_keyfile=tls.key if tls is not None else None,
    )


class _Follower(uvicorn.Server):
    """The HTTPS listener's server: no lifespan, no signal handlers; it stops when ``leader`` is told to."""

    def __init__(self, config: uvicorn.Config, leader: uvicorn.Server) -> None:
        super().__init__(config)
        self._leader = leader

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def on_tick(self, counter: int) -> bool:
        if self._leader.should_exit:
            self.should_exit = True
            self.force_exit = self.force_exit or self._leader.force_exit
        return await super().on_tick(counter)


def _bind(listener: TlsListener) -> socket.socket:
    """The HTTPS socket, bound and listening (:raises InvalidArgument: the address is taken or not ours)."""
    try:
        sock = listen_tcp(listener.host, listener.port)
    except OSError as err:
        raise InvalidArgument(f"cannot listen on {listener.host}:{listener.port} for HTTPS: {err}") from None
    sock.set_inheritable(True)
    return sock


async def serve(primary: uvicorn.Server, tls: TlsListener | None = None, activation: Activation | None = None) -> None:
    """Serve ``primary`` (:func:`http_server`) and, given ``tls``, the same app over HTTPS beside it, until
    ``primary`` stops (a signal, or ``should_exit``); the HTTPS socket is bound first, so a taken port fails the
    start before anything serves. ``primary`` runs in the caller's task (the ``SystemExit`` a signal ends it with
    unwinds the caller), the HTTPS server in one of its own; if that one ends, so does ``primary``.

    Sockets in ``activation`` (a supervisor's, :mod:`.activation`) are served instead of binding the configured
    addresses: ``http`` for ``primary``, ``https`` for the TLS listener."""
    activation = activation or Activation()
    plain = activation.get("http")
    primary_sockets = [plain] if plain is not None else None
    if tls is None:
        await primary.serve(sockets=primary_sockets)
        return
    passed = activation.get("https")
    sock = passed if passed is not None else _bind(tls)
    app = cast(ASGIApp, primary.config.app)  # what http_server was given
    follower = _Follower(_config(app, tls.host, tls.port, lifespan="off", tls=tls), primary)

    async def follow() -> None:
        while not primary.started:
            if primary.should_exit or follower.should_exit:
                return
            await asyncio.sleep(0.05)
        try:
            await follower.serve(sockets=[sock])
        finally:
            primary.should_exit = True

    following = asyncio.create_task(follow(), name="https listener")
    try:
        await primary.serve(sockets=primary_sockets)
    finally:
        follower.should_exit = True
        await following
        sock.close()
