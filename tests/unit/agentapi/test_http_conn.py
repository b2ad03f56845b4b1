"""The control plane's keep-alive connections to an agent (``agentapi.http_conn``) against a scripted HTTP server on
loopback: reuse, every way a connection stops being reusable, and which failures say "nothing was sent"."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from cryobox.agentapi import HttpAgent
from cryobox.agentapi import models as m
from cryobox.agentapi.http_conn import (
    IDLE_EXPIRY_S,
    SMALL_BODY,
    ConnectFailed,
    ConnectionPool,
    ExchangeFailed,
    Origin,
)
from cryobox.errors import CryoboxError, HostUnavailable

Reply = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Given a request's head and body, answer on the writer; ``False`` ends the connection."""


def ok(body: bytes = b"{}", extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


@dataclass
class Scripted:
    """An HTTP/1.1 server on 127.0.0.1 answering each request with ``reply`` (echoing the body by default)."""

    reply: Reply | None = None
    accepted: int = 0
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    port: int = 0

    async def _echo(self, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(body))
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                if not await (self.reply or self._echo)(head, body, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close_all(self) -> None:
        for writer in self.writers:
            writer.close()
        await asyncio.sleep(0.05)


@pytest.fixture
async def server() -> AsyncIterator[Scripted]:
    scripted = Scripted()
    srv = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
    scripted.port = srv.sockets[0].getsockname()[1]
    async with srv:
        yield scripted
        await scripted.close_all()


def pool_for(server: Scripted, **kw: object) -> ConnectionPool:
    return ConnectionPool(f"http://127.0.0.1:{server.port}", **kw)  # type: ignore[arg-type]


async def post(pool: ConnectionPool, body: bytes = b'{"a":1}', read_s: float | None = 5.0) -> bytes:
    head = f"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    answer = await pool.request(head, body, connect_s=2.0, read_s=read_s)
    assert answer.status == 200
    return answer.body


async def test_sequential_calls_share_one_connection(server: Scripted) -> None:
    pool = pool_for(server)
    for i in range(5):
        assert await post(pool, f'{{"i":{i}}}'.encode()) == f'{{"i":{i}}}'.encode()
    assert server.accepted == 1 and pool.opened == 1 and pool.idle == 1
    await pool.aclose()
    assert pool.idle == 0


async def test_concurrent_calls_each_get_a_connection_and_all_are_kept(server: Scripted) -> None:
    gate = asyncio.Event()

    async def held(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        await gate.wait()
        writer.write(ok(body))
        return True

    server.reply = held
    pool = pool_for(server)
    calls = [asyncio.create_task(post(pool, f"{i}".encode())) for i in range(3)]
    await asyncio.sleep(0.1)
    gate.set()
    assert await asyncio.gather(*calls) == [b"0", b"1", b"2"]
    assert server.accepted == 3 and pool.idle == 3
    await post(pool)
    assert server.accepted == 3
    await pool.aclose()


async def test_connection_close_is_not_reused(server: Scripted) -> None:
    async def closing(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(body, "connection: close\r\n"))
        return False

    server.reply = closing
    pool = pool_for(server)
    await post(pool)
    await post(pool)
    assert server.accepted == 2 and pool.idle == 0
    await pool.aclose()


async def test_an_idle_connection_the_agent_closed_is_replaced_not_failed(server: Scripted) -> None:
    pool = pool_for(server)
    await post(pool)
    await server.close_all()  # the agent restarted, or its keep-alive timer fired
    assert await post(pool, b"again") == b"again"
    assert server.accepted == 2
    await pool.aclose()


async def test_an_idle_connection_closed_unseen_by_the_loop_is_replaced(server: Scripted) -> None:
    """The agent's close arrived but the loop has not read it yet: the idle connection is readable, so stale."""
    pool = pool_for(server)
    await post(pool)
    for writer in server.writers:  # the server's FIN, sent without running the loop
        fd = writer.get_extra_info("socket").fileno()
        with socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_WR)
    time.sleep(0.05)  # noqa: ASYNC251 - the point: the FIN arrives while the loop does not run
    assert await post(pool, b"fresh") == b"fresh"
    assert server.accepted == 2
    await pool.aclose()


async def test_an_old_idle_connection_is_not_reused(server: Scripted) -> None:
    now = [100.0]
    pool = pool_for(server, clock=lambda: now[0])
    await post(pool)
    now[0] += IDLE_EXPIRY_S - 0.5
    await post(pool)
    assert server.accepted == 1
    now[0] += IDLE_EXPIRY_S + 0.5
    await post(pool)
    assert server.accepted == 2
    await pool.aclose()


async def test_refused_is_connect_failed() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    pool = ConnectionPool(f"http://127.0.0.1:{port}")
    with pytest.raises(ConnectFailed):
        await pool.request(b"GET / HTTP/1.1\r\n\r\n", None, connect_s=2.0, read_s=1.0)


@pytest.mark.parametrize(
    "answer",
    [b"", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", b"NOT HTTP AT ALL\r\n\r\n"],
    ids=["nothing", "cut-short", "malformed"],
)
async def test_no_whole_answer_is_exchange_failed(server: Scripted, answer: bytes) -> None:
    async def broken(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer)
        await writer.drain()
        return False

    server.reply = broken
    pool = pool_for(server)
    with pytest.raises(ExchangeFailed):
        await post(pool)
    assert pool.idle == 0
    server.reply = None
    await post(pool)  # a new connection
    await pool.aclose()


async def test_read_timeout_and_cancel_drop_the_connection(server: Scripted) -> None:
    async def silent(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    server.reply = silent
    pool = pool_for(server)
    with pytest.raises(ExchangeFailed, match="no answer within 0.2 s"):
        await post(pool, read_s=0.2)
    call = asyncio.create_task(post(pool, read_s=None))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert pool.idle == 0 and server.accepted == 2
    server.reply = None
    await post(pool)
    assert server.accepted == 3
    await pool.aclose()


async def test_chunked_answer_and_large_body(server: Scripted) -> None:
    async def chunked(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-Seen: yes\r\n\r\n")
        for part in (body[:7], body[7:]):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        writer.write(b"0\r\n\r\n")
        return True

    server.reply = chunked
    pool = pool_for(server)
    big = bytes(range(256)) * (SMALL_BODY // 256 + 3)
    head = f"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: {len(big)}\r\n\r\n".encode()
    answer = await pool.request(head, big, connect_s=2.0, read_s=5.0)
    assert answer.body == big and answer.headers["x-seen"] == "yes"
    assert server.requests[-1][1] == big
    await post(pool)
    assert server.accepted == 1
    await pool.aclose()


def test_connections_stay_with_their_loop() -> None:
    """A pool used from one ``asyncio.run`` and then another (a CLI) makes new connections in the second."""
    accepted = []

    async def serve_twice(port_box: list[int], ready: asyncio.Event) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(1)
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                writer.write(ok(b"x"))
            writer.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_box.append(srv.sockets[0].getsockname()[1])
        ready.set()
        async with srv:
            await asyncio.to_thread(stop.wait, 30)

    box: list[int] = []
    started, stop = threading.Event(), threading.Event()

    def server_thread() -> None:
        async def main() -> None:
            ready = asyncio.Event()
            task = asyncio.create_task(serve_twice(box, ready))
            await ready.wait()
            started.set()
            await task

        asyncio.run(main())

    thread = threading.Thread(target=server_thread, daemon=True)
    thread.start()
    assert started.wait(5)
    pool = ConnectionPool(f"http://127.0.0.1:{box[0]}")
    head = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert first.run_until_complete(pool.request(head, None, connect_s=2.0, read_s=2.0)).body == b"x"
        assert pool.idle == 1
        assert second.run_until_complete(pool.request(head, None, connect_s=2.0, read_s=2.0)).body == b"x"
        assert pool.opened == 2 and pool.idle == 1  # the first loop's connection was closed, not used
        second.run_until_complete(pool.aclose())
        first.run_until_complete(asyncio.sleep(0.01))  # the first loop carries out the close it was asked for
    finally:
        first.close()
        second.close()
        stop.set()
    thread.join(5)


def test_origin() -> None:
    assert Origin.of("http://10.0.0.2:8080/base/") == Origin("http", "10.0.0.2", 8080, "/base")
    assert Origin.of("https://agent.example").port == 443
    assert Origin.of("https://agent.example").host_header == "agent.example"
    assert Origin.of("http://[::1]:81").host_header == "[::1]:81"
    with pytest.raises(ValueError):
        Origin.of("unix:///run/agent.sock")


async def test_http_agent_says_whether_anything_was_sent(server: Scripted) -> None:
    """A call whose connection broke after it was sent may have taken effect: not ``HostUnavailable`` (which
    callers retry elsewhere), but a plain error naming the agent; the request was framed as the agent expects."""

    async def hang_up(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        return False

    server.reply = hang_up
    async with HttpAgent(f"http://127.0.0.1:{server.port}/prefix", "tok", name="a1") as agent:
        with pytest.raises(CryoboxError) as err:
            await agent.exec("sb-1", m.ExecRequest(cmd="true"))
        assert not isinstance(err.value, HostUnavailable)
        assert "failed mid-way" in err.value.message and err.value.details == {"agent": "a1"}
    head, body = server.requests[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /prefix/agent/v1/sandboxes/sb-1/exec HTTP/1.1"
    assert {"Authorization: Bearer tok", "Content-Type: application/json", f"Host: 127.0.0.1:{server.port}"} <= set(
        lines
    )
    assert m.ExecRequest.model_validate_json(body).cmd == "true"


@pytest.mark.parametrize("url", ["10.0.0.2:7480", "ftp://10.0.0.2/"])
async def test_an_agent_url_that_is_no_http_url_is_unavailable_not_a_crash(url: str) -> None:
    """An agent registered with a URL the control plane cannot speak to (an ``--advertise`` without its scheme)
    answers its callers 503, as an unreachable agent does, not 500."""
    async with HttpAgent(url, "tok", name="odd") as agent:
        with pytest.raises(HostUnavailable):
            await agent.info()
        with pytest.raises(HostUnavailable):
            await agent.exec("sb-1", m.ExecRequest(cmd="true"))
