"""Listeners made by cryobox hand asyncio connections without Nagle's delay: whichever way a listener came (bound
here for ``serve``, for the HTTPS listener, passed by a supervisor), a connection it accepts has ``TCP_NODELAY``
on. With it off, every response written in two pieces waited for the client's delayed ACK (+40 ms a request)."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from cryobox.compose.activation import take_activation
from cryobox.compose.handover import bind_http
from cryobox.util.tcp import listen_tcp, tcp_socket


async def _accepted_nodelay(listener: socket.socket) -> int:
    """What asyncio's server leaves ``TCP_NODELAY`` at on a connection ``listener`` accepts."""
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_connect(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        value = await asyncio.wait_for(seen, 5)
        writer.close()
        return value
    finally:
        server.close()
        await server.wait_closed()


def test_a_plain_listener_gives_asyncio_connections_with_nagle_on() -> None:
    """The control: what the listeners were before (``proto`` 0) — asyncio does not touch them."""
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    assert asyncio.run(_accepted_nodelay(plain)) == 0


@pytest.mark.parametrize("make", [lambda: listen_tcp("127.0.0.1", 0), lambda: bind_http("127.0.0.1", 0)])
def test_cryobox_listeners_accept_connections_without_nagle(make: object) -> None:
    listener = make()  # type: ignore[operator]
    assert listener.proto == socket.IPPROTO_TCP
    assert asyncio.run(_accepted_nodelay(listener)) != 0


def test_a_passed_listener_gets_no_delay_too() -> None:
    made = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # as a supervisor might make it
    made.bind(("127.0.0.1", 0))
    made.listen()
    fd = os.dup(made.fileno())
    made.close()
    env = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid()), "LISTEN_FDNAMES": "http"}
    activation = take_activation(env, first_fd=fd)
    passed = activation.sockets["http"]
    assert passed.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    assert asyncio.run(_accepted_nodelay(passed)) != 0


def test_tcp_socket_is_tcp_with_no_delay() -> None:
    with tcp_socket(socket.AF_INET6) as sock:
        assert sock.proto == socket.IPPROTO_TCP and sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
