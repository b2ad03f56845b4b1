"""Keep-alive HTTP/1.1 connections from the control plane to one agent, for its calls that are not streams.

Every create, exec, get and delete of a fleet crosses here, and its cost is paid by a user on every call: the hop
must cost next to nothing (issue 37: ≤ 3 ms p50 added to create and to exec, ``bench fleet``). httpx's connection
pool and h11 cost ~1 ms of a call on a host whose caches a guest has just cleared (a scratch run, an exec's round
trip to a stub agent with 48 MiB read between calls: httpx 1.66 ms p50, aiohttp 1.11, this module 0.69); the hop
it is part of was 2.2-3.7 ms. So requests are framed here (one line, the agent's fixed headers, ``Content-Length``)
and answers parsed by httptools (llhttp, the parser uvicorn serves with); streams, raw uploads of the port proxy
and everything else of the agent API keep httpx (:mod:`.http_client`).

One request at a time per connection; idle connections are reused most recent first, and dropped once the agent
closed them, answered ``Connection: close``, or have been idle for :data:`IDLE_EXPIRY_S` (under uvicorn's own 5 s,
so a request never meets the server's close of an idle connection half-way). Nothing is retried: a failure before
anything was sent is :class:`ConnectFailed`, any other :class:`ExchangeFailed` (the request may have taken effect).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_EXPIRY_S = 4.0
"""An idle connection older than this is closed rather than reused (uvicorn closes idle ones after 5 s)."""
MAX_IDLE = 32
SMALL_BODY = 64 << 10
"""A body up to this size leaves in one write with the head (copied into it); a larger one in a write of its own."""


class ConnectFailed(Exception):
    """No connection to the agent (refused, unreachable, timed out): nothing was sent."""


class ExchangeFailed(Exception):
    """The request went out (maybe in part) and no whole answer came back: it may have taken effect."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Names in lower case (the last of repeated ones)."""
    body: bytes


@dataclass(frozen=True)
class Origin:
    """Where an agent's URL points: scheme, host, port, and the path its API sits under."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the answer it is reading."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[Answer] | None = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: the connection is not in a state to reuse
            self.fail(ExchangeFailed("the agent sent data outside an answer"))
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self.fail(ExchangeFailed(f"malformed answer: {err}"))

    def eof_received(self) -> bool:
        self.fail(ExchangeFailed("the agent closed the connection before answering"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ExchangeFailed(f"connection lost: {exc}" if exc else "connection lost"))

    # -- httptools callbacks --

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        answer, self.answer = self.answer, None
        self.reusable = self.parser.should_keep_alive()
        headers, self._headers = self._headers, {}
        body = b"".join(self._body)
        self._body = []
        if answer is not None and not answer.done():
            answer.set_result(Answer(self.parser.get_status_code(), headers, body))

    # -- the pool's side --

    def send(self, head: bytes, body: bytes | None, answer: asyncio.Future[Answer]) -> None:
        assert self.transport is not None
        self.answer = answer
        self.reusable = False
        if body and len(body) > SMALL_BODY:
            self.transport.write(head)
            self.transport.write(body)
        else:  # one segment
            self.transport.write(head + body if body else head)

    def fail(self, err: Exception) -> None:
        self.reusable = False
        self.close()
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            answer.set_exception(err)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(RuntimeError):  # its loop is closed: so is the socket, with it
                self.transport.abort()

    def stale(self, now: float) -> bool:
        """Closed, expired, or readable while idle (the agent's close not seen by the loop yet)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return True
        if now - self.idle_since > IDLE_EXPIRY_S:
            return True
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
        return bool(readable)


class ConnectionPool:
    """Connections to the agent at ``url``: :meth:`request` sends one request on an idle connection or a new one."""

    def __init__(
        self,
        url: str,
        *,
        max_idle: int = MAX_IDLE,
        ssl_context: Callable[[], ssl.SSLContext] = ssl.create_default_context,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.origin = Origin.of(url)
        self._ssl = ssl_context
        self._tls: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._clock = clock
        self._closed = False
        self.opened = 0
        """Connections made so far (for tests and the curious)."""

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def _connect(self, connect_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        if self.origin.scheme == "https" and self._tls is None:
            self._tls = self._ssl()  # once: loading the trust store takes milliseconds
        tls = self._tls
        host = self.origin.host
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    _Connection, host, self.origin.port, ssl=tls, server_hostname=host if tls else None
                )
        except (OSError, TimeoutError, ssl.SSLError) as err:
            raise ConnectFailed(f"{type(err).__name__}: {err}") from err
        self.opened += 1
        return conn

    async def _acquire(self, connect_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop they were made in (a CLI's asyncio.run each)
            self._loop = loop
            idle, self._idle = self._idle, []
            for conn in idle:
                conn.close()
        now = self._clock()
        while self._idle:
            conn = self._idle.pop()
            if not conn.stale(now):
                return conn
            conn.close()
        return await self._connect(connect_s)

    def _release(self, conn: _Connection) -> None:
        if conn.reusable and not conn.closed and not self._closed and len(self._idle) < self._max_idle:
            conn.idle_since = self._clock()
            self._idle.append(conn)
        else:
            conn.close()

    async def request(self, head: bytes, body: bytes | None, *, connect_s: float, read_s: float | None) -> Answer:
        """Send ``head`` (the request line and headers, ``Content-Length`` included, ending in a blank line) and
        ``body``; the whole answer, read within ``read_s`` (``None``: however long it takes)."""
        if self._closed:
            raise ConnectFailed("the pool is closed")
        conn = await self._acquire(connect_s)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Answer] = loop.create_future()
        timer = None
        if read_s is not None:
            timer = loop.call_later(read_s, conn.fail, ExchangeFailed(f"no answer within {read_s:g} s"))
        try:
            conn.send(head, body, answer)
            result = await answer
        except BaseException:  # failed, timed out or cancelled: the connection is in no state to reuse
            conn.close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._release(conn)
        return result

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


__all__ = ["Answer", "ConnectFailed", "ConnectionPool", "ExchangeFailed", "Origin"]
