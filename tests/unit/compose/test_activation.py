"""Sockets handed over by a supervisor (systemd's socket activation protocol), read from fds and variables."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from cryobox.compose.activation import take_activation
from cryobox.errors import InvalidArgument

FIRST = 240  # fds this test places its sockets at (systemd uses 3, which pytest's own files may hold)


@pytest.fixture
def placed() -> Iterator[list[socket.socket]]:
    """Two listening sockets at fds FIRST and FIRST + 1, as a supervisor passes them."""
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    for index, server in enumerate(servers):
        os.dup2(server.fileno(), FIRST + index)
    try:
        yield servers
    finally:
        for index, server in enumerate(servers):
            server.close()
            try:
                os.close(FIRST + index)
            except OSError:
                pass  # taken over (and closed) by the test's Activation


def _env(count: int, names: str | None = None, pid: int | None = None) -> dict[str, str]:
    env = {"LISTEN_FDS": str(count), "LISTEN_PID": str(os.getpid() if pid is None else pid), "OTHER": "kept"}
    if names is not None:
        env["LISTEN_FDNAMES"] = names
    return env


def test_named_sockets_are_taken_and_the_variables_removed(placed: list[socket.socket]) -> None:
    env = _env(2, "https:http")
    activation = take_activation(env, first_fd=FIRST)
    assert env == {"OTHER": "kept"}  # no child process will take them for its own
    assert activation.get("https").getsockname() == placed[0].getsockname()  # type: ignore[union-attr]
    assert activation.get("http").getsockname() == placed[1].getsockname()  # type: ignore[union-attr]
    assert not os.get_inheritable(FIRST) and not os.get_inheritable(FIRST + 1)
    # the handed-over socket serves: a client connects through it
    with socket.create_connection(placed[1].getsockname()[:2], timeout=5):
        conn, _ = activation.sockets["http"].accept()
        conn.close()
    for sock in activation.sockets.values():
        sock.close()


def test_unnamed_sockets_are_http_then_https(placed: list[socket.socket]) -> None:
    activation = take_activation(_env(2), first_fd=FIRST)
    assert activation.sockets["http"].getsockname() == placed[0].getsockname()
    assert activation.sockets["https"].getsockname() == placed[1].getsockname()
    for sock in activation.sockets.values():
        sock.close()


def test_variables_meant_for_another_process_are_dropped_and_ignored(placed: list[socket.socket]) -> None:
    env = _env(2, "http:https", pid=os.getpid() + 1)  # the parent was activated, not us
    assert take_activation(env, first_fd=FIRST).sockets == {}
    assert env == {"OTHER": "kept"}
    assert take_activation({"OTHER": "x"}, first_fd=FIRST).sockets == {}
    os.fstat(FIRST)  # untouched: still open, the fixture's to close


def test_a_malformed_hand_over_is_refused(placed: list[socket.socket]) -> None:
    with pytest.raises(InvalidArgument, match="named 'admin'"):
        take_activation(_env(1, "admin"), first_fd=FIRST)
    with pytest.raises(InvalidArgument, match="named 'http'"):
        take_activation(_env(2, "http:http"), first_fd=FIRST)
    with pytest.raises(InvalidArgument, match="not a number"):
        take_activation({"LISTEN_FDS": "x", "LISTEN_PID": str(os.getpid())}, first_fd=FIRST)
    # a bound socket that does not listen is not something to serve on
    idle = socket.socket()
    idle.bind(("127.0.0.1", 0))
    os.dup2(idle.fileno(), FIRST)
    with pytest.raises(InvalidArgument, match="not a listening stream socket"):
        take_activation(_env(1), first_fd=FIRST)
    idle.close()
