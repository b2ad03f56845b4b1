"""TCP sockets made here rather than by asyncio or uvicorn: with ``TCP_NODELAY`` on, as theirs would have.

asyncio turns Nagle's algorithm off on every TCP connection it wraps, but only on sockets whose ``proto`` is
``IPPROTO_TCP``: a listener made with ``socket.socket(AF_INET, SOCK_STREAM)`` has ``proto`` 0, so do the
connections it accepts, and asyncio leaves them with Nagle on. A response written in two pieces (headers, then the
body) then waits for the client's delayed ACK: +40 ms on every request (measured: a sandbox ``GET`` 48–52 ms, an
``exec`` 76 ms p50, against 2 ms and ~30 ms). Linux copies a listener's ``TCP_NODELAY`` to each connection it
accepts, so setting it on the listener covers whoever accepts.
"""

from __future__ import annotations

import socket


def no_delay(sock: socket.socket) -> socket.socket:
    """``TCP_NODELAY`` on ``sock`` (a TCP socket; a listener passes it on to what it accepts); ``sock``."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def tcp_socket(family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket (``proto`` ``IPPROTO_TCP``, so asyncio treats it as one) with ``TCP_NODELAY`` on."""
    return no_delay(socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP))


def listen_tcp(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP listener on ``host:port`` (``SO_REUSEADDR``; IPv6 for an address with a colon), its connections
    without Nagle's delay. :raises OSError: the address is taken or not this host's."""
    sock = tcp_socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
