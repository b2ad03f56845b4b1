"""A stopping server answers the request of a connection it accepted before the stop but had read nothing of yet
(uvicorn's own protocol closed it unanswered: an upgrade's failed request), and then closes it."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from cryobox.compose.draining import _pending
from cryobox.compose.listeners import http_server
from cryobox.util.tcp import listen_tcp


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": f"{message['type']}.complete"})
            if message["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def serving_app() -> tuple[socket.socket, uvicorn.Server, asyncio.Task[None]]:
    """:func:`app` served by ``http_server`` on a loopback socket, once it serves: (the socket, server, task)."""
    sock = listen_tcp("127.0.0.1", 0)
    server = http_server(app, "127.0.0.1", sock.getsockname()[1])
    server.config.log_level = "warning"
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return sock, server, serving


async def accepted(server: uvicorn.Server) -> None:
    """Until the server has accepted the test's connection."""
    for _ in range(100):
        if server.server_state.connections:
            return
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("sends_after_s", [0.0, 0.1, None])
async def test_a_connection_accepted_before_the_stop_gets_its_answer(sends_after_s: float | None) -> None:
    """0.0: the request is in the socket's buffer when the stop begins (``FIONREAD``: waited for however long the
    loop takes); 0.1: it arrives within the grace; None: nothing arrives, the connection is closed."""
    sock, server, serving = await serving_app()
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    await accepted(server)
    request = b"POST /v1/sandboxes/x/exec HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n"
    if sends_after_s == 0.0:
        writer.write(request)  # in the server's receive buffer before it reads: its stop sees it pending
    server.should_exit = True  # a stop (an upgrade's hand-over) while the request is still on its way
    if sends_after_s is None:  # a connection that never sends is closed after the grace
        assert await asyncio.wait_for(reader.read(), 5) == b""
    else:
        if sends_after_s > 0:
            await asyncio.sleep(sends_after_s)  # the stop has begun: the server no longer accepts
            writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 5)  # read to the end: the server closes after answering
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok"), answer
        if sends_after_s > 0:  # arrived while stopping: told to close, not left to find out
            assert b"\r\nconnection: close\r\n" in answer.lower(), answer
    writer.close()
    await asyncio.wait_for(serving, 10)
    sock.close()


async def test_a_fresh_connection_gets_its_grace_however_long_ago_it_was_accepted() -> None:
    """A connection that has sent nothing yet since its accept is about to send its first request, however slow
    its client (a loaded host): it gets the pending grace counted from its accept, not what is left of the idle
    grace (a restart under a full suite's load reset one exec this way)."""
    sock, server, serving = await serving_app()
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    await accepted(server)
    await asyncio.sleep(0.4)  # accepted longer ago than the idle grace
    server.should_exit = True
    await asyncio.sleep(0.3)  # past the idle grace, within the pending one
    writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok"), answer
    writer.close()
    await asyncio.wait_for(serving, 10)
    sock.close()


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> socket.socket | None:
        return self.sock if name == "socket" else None


async def test_a_connection_silent_since_long_before_the_stop_does_not_hold_it() -> None:
    """A connection accepted more than the pending grace before the stop that has sent nothing (a browser's
    speculative connection) is not about to send: it is closed at once, not waited for."""
    sock, server, serving = await serving_app()
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    await accepted(server)
    await asyncio.sleep(1.1)
    asked = asyncio.get_running_loop().time()
    server.should_exit = True
    assert await asyncio.wait_for(reader.read(), 5) == b""
    await asyncio.wait_for(serving, 10)
    took = asyncio.get_running_loop().time() - asked
    writer.close()
    sock.close()
    assert took < 0.2, took


def test_pending_sees_bytes_not_read_yet() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not _pending(_Transport(ours))  # type: ignore[arg-type]
        theirs.sendall(b"GET / HTTP/1.1\r\n")
        assert _pending(_Transport(ours))  # type: ignore[arg-type]
        ours.recv(100)
        assert not _pending(_Transport(ours))  # type: ignore[arg-type]


async def test_a_connection_idle_past_the_grace_does_not_hold_the_stop() -> None:
    """A keep-alive connection left idle longer than the grace is closed at once: the stop does not wait 0.25 s for
    a request its client is not about to send (uvicorn's ticks are gone too: the whole stop is well under it)."""
    sock, server, serving = await serving_app()
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200 ")
    await asyncio.sleep(0.4)  # idle, kept alive, past the grace
    asked = asyncio.get_running_loop().time()
    server.should_exit = True
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed without a grace
    await asyncio.wait_for(serving, 10)
    took = asyncio.get_running_loop().time() - asked
    writer.close()
    sock.close()
    assert took < 0.2, took
