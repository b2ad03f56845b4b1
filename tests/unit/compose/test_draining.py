"""A stopping server answers the request of a connection it accepted before the stop but had read nothing of yet
(uvicorn's own protocol closed it unanswered: an upgrade's failed request), and then closes it."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Receive, Scope, Send

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


@pytest.mark.parametrize("sends_after_s", [0.05, None])
async def test_a_connection_accepted_before_the_stop_gets_its_answer(sends_after_s: float | None) -> None:
    sock = listen_tcp("127.0.0.1", 0)
    server = http_server(app, "127.0.0.1", sock.getsockname()[1])
    server.config.log_level = "warning"
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    for _ in range(100):  # until the server has accepted it
        if server.server_state.connections:
            break
        await asyncio.sleep(0.01)
    server.should_exit = True  # a stop (an upgrade's hand-over) while the request is still on its way
    await asyncio.sleep(0.15)  # the stop has begun: the server no longer accepts
    if sends_after_s is None:  # a connection that never sends is closed after the grace
        assert await asyncio.wait_for(reader.read(), 5) == b""
    else:
        writer.write(b"POST /v1/sandboxes/x/exec HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)  # read to the end: the server closes after answering
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok"), answer
    writer.close()
    await asyncio.wait_for(serving, 10)
    sock.close()
