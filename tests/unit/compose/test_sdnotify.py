"""``sd_notify``: what ``cryobox serve`` tells systemd reaches ``$NOTIFY_SOCKET`` (a path or an abstract name),
stamped by the kernel with the sender's pid; nothing is sent without the variable, and a dead socket stops
nothing."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from cryobox.compose.sdnotify import notify
from tests.support.sdnotify import notify_socket


def test_lines_reach_the_socket_with_the_senders_pid(tmp_path: Path) -> None:
    with notify_socket(tmp_path / "notify") as listener:
        assert notify("READY=1", "STATUS=serving", env={"NOTIFY_SOCKET": str(listener.path)})
        listener.wait_for("READY=1", os.getpid(), timeout_s=5)
        listener.wait_for("STATUS=serving", os.getpid(), timeout_s=5)


def test_an_abstract_socket_name() -> None:
    name = f"cryobox-test-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify("MAINPID=42", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(100) == b"MAINPID=42"


def test_nothing_is_sent_without_a_manager_and_a_dead_socket_stops_nothing(tmp_path: Path) -> None:
    assert not notify("READY=1", env={})
    assert not notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"})
