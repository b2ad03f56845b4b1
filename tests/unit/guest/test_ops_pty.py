"""The pty ops in-process: the agent serves one end of a socketpair, the test drives the other."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cryobox.guest.agent import GuestAgent
from tests.support.guest import Client, Harness, process_gone


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(GuestAgent(clock_setter=lambda ns: None))
    yield h
    h.close()


class Terminal:
    """A ``pty_open`` request in flight: its events are collected as they arrive."""

    def __init__(self, client: Client, args: dict[str, Any]) -> None:
        self.client = client
        self.req_id = client.send("pty_open", args)
        self.output = b""
        self.final: dict[str, Any] | None = None
        self.replies: dict[int, dict[str, Any]] = {}
        first = self._next_own()
        assert first.get("event") == "session", first
        self.session = base64.b64decode(first["data"]).decode()

    def _next_own(self) -> dict[str, Any]:
        """The next frame of the pty_open request (replies to other requests are kept aside)."""
        while True:
            frame = self.client.recv()
            if frame["id"] == self.req_id:
                return frame
            self.replies[frame["id"]] = frame

    def pump_until(self, predicate: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate() and self.final is None:
            assert time.monotonic() < deadline, f"timed out; output so far: {self.output!r}"
            frame = self._next_own()
            if "event" in frame:
                assert frame["event"] == "output"
                self.output += base64.b64decode(frame["data"])
            else:
                self.final = frame

    def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Another request while the terminal streams: output frames read meanwhile are kept."""
        req_id = self.client.send(op, {"session": self.session, **args})
        while req_id not in self.replies:
            frame = self.client.recv()
            if frame["id"] == req_id:
                return frame
            if frame["id"] == self.req_id:
                if "event" in frame:
                    self.output += base64.b64decode(frame["data"])
                else:
                    self.final = frame
            else:
                self.replies[frame["id"]] = frame
        return self.replies.pop(req_id)

    def send(self, text: str) -> None:
        reply = self.call("pty_input", {"data": base64.b64encode(text.encode()).decode()})
        assert reply["ok"] is True, reply

    def wait_exit(self, timeout: float = 10.0) -> dict[str, Any]:
        self.pump_until(lambda: False, timeout)
        assert self.final is not None
        return self.final


def test_shell_runs_input_and_exits(harness: Harness) -> None:
    term = Terminal(harness.client, {"cmd": "/bin/sh", "cols": 100, "rows": 30})
    term.send("echo h''i; exit\n")
    final = term.wait_exit()
    assert final["ok"] is True, final
    assert final["result"]["exit_code"] == 0
    assert final["result"]["session"] == term.session
    lines = [line.strip() for line in term.output.decode(errors="replace").splitlines()]
    # the command's output, not the terminal's echo of the input (a prompt may precede it on the same line)
    assert any(line.endswith("hi") for line in lines), lines
    assert len(harness.agent.pty) == 0


def test_exit_code_and_controlling_tty(harness: Harness) -> None:
    term = Terminal(harness.client, {"cmd": ["/bin/sh"]})
    term.send("tty -s && echo has-a-tty; exit 5\n")
    final = term.wait_exit()
    assert final["result"]["exit_code"] == 5
    assert b"has-a-tty" in term.output


def test_resize(harness: Harness) -> None:
    term = Terminal(harness.client, {"cmd": "/bin/sh", "cols": 80, "rows": 24})
    term.send("stty size\n")
    term.pump_until(lambda: b"24 80" in term.output)
    reply = term.call("pty_resize", {"cols": 132, "rows": 43})
    assert reply["ok"] is True and reply["result"] == {"cols": 132, "rows": 43}
    term.send("stty size; exit\n")
    term.wait_exit()
    assert b"43 132" in term.output


def test_close_hangs_up_the_session(harness: Harness) -> None:
    term = Terminal(harness.client, {"cmd": "/bin/sh"})
    term.send('sleep 60 & echo bg""=$!; wait\n')
    term.pump_until(lambda: re.search(rb"bg=(\d+)\s", term.output) is not None)
    found = re.search(rb"bg=(\d+)\s", term.output)
    assert found is not None
    bg_pid = int(found.group(1))
    reply = term.call("pty_close", {})
    assert reply["ok"] is True
    final = term.wait_exit()
    assert final["ok"] is True
    assert final["result"]["exit_code"] != 0  # killed by the hangup
    deadline = time.monotonic() + 5
    while not process_gone(bg_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_gone(bg_pid)
    # the session is gone: further input is refused
    gone = harness.client.call("pty_input", {"session": term.session, "data": ""})
    assert gone["ok"] is False and gone["error"]["code"] == "not_found"


def test_bad_arguments(harness: Harness) -> None:
    client = harness.client
    assert client.error_code("pty_open", {"cols": 0}) == "invalid_argument"
    assert client.error_code("pty_open", {"cmd": 5}) == "invalid_argument"
    assert client.error_code("pty_open", {"cmd": "/nonexistent/shell"}) == "not_found"
    assert client.error_code("pty_input", {"session": "pty-nope", "data": ""}) == "not_found"
    assert client.error_code("pty_resize", {"session": "pty-nope", "cols": 10, "rows": 10}) == "not_found"
    assert client.error_code("pty_close", {"session": 3}) == "invalid_argument"
