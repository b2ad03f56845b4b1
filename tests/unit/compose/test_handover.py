"""The upgrade handover's plumbing with real processes: the successor gets the listening socket at fd 3 with
``LISTEN_FDS``/``LISTEN_PID`` naming it, and the pipe says ``ready`` or closes when the successor dies first."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest

from cryobox.compose.handover import HANDOVER_ENV, announce_ready, bind_http, spawn_successor, take_handover
from cryobox.errors import InvalidArgument

CHILD = """
import os, socket, sys
from cryobox.compose.activation import take_activation
from cryobox.compose.handover import announce_ready, take_handover
activation = take_activation()
fd = take_handover()
sock = activation.get("http")
assert sock is not None and fd is not None, (dict(os.environ), fd)
conn, _ = sock.accept()
conn.sendall(b"served by the successor")
conn.close()
announce_ready(fd)
"""


def test_the_successor_gets_the_socket_and_says_ready() -> None:
    listener = bind_http("127.0.0.1", 0)
    try:
        successor = spawn_successor(listener, [sys.executable, "-c", CHILD])
        with socket.create_connection(listener.getsockname(), timeout=30) as client:
            assert client.recv(100) == b"served by the successor"  # the same socket, accepted in the child
        assert asyncio.run(successor.wait_ready()) is True
        assert successor.process.wait(30) == 0
    finally:
        listener.close()


def test_a_successor_that_dies_first_is_not_ready() -> None:
    listener = bind_http("127.0.0.1", 0)
    try:
        successor = spawn_successor(listener, [sys.executable, "-c", "raise SystemExit(3)"])
        assert asyncio.run(successor.wait_ready()) is False
        assert successor.process.wait(30) == 3
    finally:
        listener.close()


def test_take_handover_reads_and_removes_the_variable() -> None:
    read_fd, write_fd = os.pipe()
    env = {HANDOVER_ENV: str(write_fd), "OTHER": "1"}
    fd = take_handover(env)
    assert fd == write_fd and env == {"OTHER": "1"}
    announce_ready(write_fd)
    assert os.read(read_fd, 16) == b"ready\n"
    os.close(read_fd)
    assert take_handover({}) is None and take_handover({HANDOVER_ENV: "x"}) is None


def test_a_taken_port_is_a_clear_error() -> None:
    taken = bind_http("127.0.0.1", 0)
    try:
        with pytest.raises(InvalidArgument, match="cannot listen"):
            bind_http("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
