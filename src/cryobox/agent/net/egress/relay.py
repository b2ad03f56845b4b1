"""Bytes between a guest's connection and the proxy's own, one direction per :func:`pump`, moved by the kernel:
``splice(2)`` from the source socket into a pipe and from the pipe into the destination socket, so no byte is
copied into Python. The event loop only waits for readiness (``add_reader``/``add_writer`` on the raw sockets).

Measured on a 2-core host (``cryobox bench net``): a relay through asyncio streams moved about half of what the
kernel forwards directly; splicing is what keeps the proxy close to direct forwarding.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from collections.abc import Callable

F_SETPIPE_SZ = 1031
PIPE_SIZE = 1 << 20
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


async def _ready(fd: int, *, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    (loop.add_writer if writable else loop.add_reader)(fd, wake)
    try:
        await done
    finally:
        (loop.remove_writer if writable else loop.remove_reader)(fd)


async def pump(source: socket.socket, sink: socket.socket, count: Callable[[int], None]) -> None:
    """Move everything ``source`` sends to ``sink`` (both non-blocking); at ``source``'s end, half-close ``sink``
    (its peer sees the end, the other direction goes on). ``count`` is told each chunk taken from ``source``.

    :raises OSError: either end failed (reset, unreachable).
    """
    out, into = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # a smaller pipe only means more rounds
        fcntl.fcntl(into, F_SETPIPE_SZ, PIPE_SIZE)
    try:
        while True:
            try:
                moved = os.splice(source.fileno(), into, PIPE_SIZE, flags=FLAGS)
            except BlockingIOError:
                await _ready(source.fileno(), writable=False)
                continue
            if moved == 0:
                break
            count(moved)
            while moved:
                try:
                    moved -= os.splice(out, sink.fileno(), moved, flags=FLAGS)
                except BlockingIOError:
                    await _ready(sink.fileno(), writable=True)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
    finally:
        os.close(out)
        os.close(into)


__all__ = ["pump"]
