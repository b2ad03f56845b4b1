"""``cryobox bisect``'s counting and report, and ``cryobox debug``'s report, against fake sandboxes."""

from __future__ import annotations

import io
import json
import os
import termios
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.sync.server import ServerConnection, serve

from cryobox.capture.bisect import BisectApi, BisectReport, ChildRun, bisect, run_children
from cryobox.capture.debug import ShellError, collect, open_shell, pty_url
from cryobox.capture.debug import debug as run_debug
from cryobox.errors import GuestError, SandboxTimeout
from cryobox.models import ForkTreeError


@dataclass
class Result:
    exit_code: int
    stdout: str = ""
    duration_ms: float = 12.5


@dataclass
class FakeChild:
    id: str
    outcome: int | Exception
    killed: bool = False
    commands: list[str] = field(default_factory=list)

    def exec(self, cmd: str, *, timeout_seconds: float | None = 60.0) -> Result:
        self.commands.append(cmd)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return Result(self.outcome)

    def kill(self) -> None:
        self.killed = True


@dataclass
class FakeTree:
    snapshot_id: str
    children: list[FakeChild]
    errors: list[ForkTreeError]


@dataclass
class FakeParent:
    id: str
    outcomes: list[int | Exception]
    errors: list[ForkTreeError] = field(default_factory=list)
    killed: bool = False
    closed: bool = False
    tree: FakeTree | None = None

    def fork_tree(self, count: int = 2) -> FakeTree:
        assert count == len(self.outcomes) + len(self.errors)
        children = [FakeChild(f"sbx-child{i}", o) for i, o in enumerate(self.outcomes)]
        self.tree = FakeTree("snap-tree", children, self.errors)
        return self.tree

    def kill(self) -> None:
        self.killed = True

    def close(self) -> None:
        self.closed = True


def fake_api(parent: FakeParent, calls: list[str]) -> BisectApi:
    def connect(sandbox_id: str) -> FakeParent:
        calls.append(f"connect {sandbox_id}")
        return parent

    def restore(snapshot_id: str) -> FakeParent:
        calls.append(f"restore {snapshot_id}")
        return parent

    return BisectApi(connect=connect, restore=restore, delete_snapshot=lambda s: calls.append(f"delete {s}"))


def test_counts_non_zero_exits_and_kills_children() -> None:
    parent = FakeParent("sbx-parent", [0, 1, 0, 2, 0, 0, 1, 0])
    calls: list[str] = []
    report = bisect("sbx-parent", "python3 /root/flaky.py", fake_api(parent, calls), count=8)
    assert (report.count, report.reproduced) == (8, 3)
    assert calls == ["connect sbx-parent", "delete snap-tree"]
    assert parent.tree is not None and all(c.killed for c in parent.tree.children)
    assert all(c.commands == ["python3 /root/flaky.py"] for c in parent.tree.children)
    assert not parent.killed and parent.closed  # the user's sandbox is left running
    text = report.render()
    assert text.startswith("3/8 reproduced (children disagree")
    assert "sbx-child3" in text
    body = report.to_json()
    assert body["count"] == 8 and body["reproduced"] == 3
    assert [c["exit_code"] for c in body["children"]] == [0, 1, 0, 2, 0, 0, 1, 0]
    assert {"id", "exit_code", "duration_ms"} <= set(body["children"][0])


def test_snapshot_target_is_restored_and_killed() -> None:
    parent = FakeParent("sbx-tmp", [1, 1, 1, 1])
    calls: list[str] = []
    report = bisect("snap-abc", "false", fake_api(parent, calls), count=4)
    assert calls[0] == "restore snap-abc"
    assert parent.killed
    assert (report.count, report.reproduced) == (4, 4)
    assert "all children agree" in report.render()


def test_errors_are_excluded_from_the_denominator() -> None:
    outcomes: list[int | Exception] = [0, 1, GuestError("agent went away"), SandboxTimeout("too slow"), 0]
    parent = FakeParent("sbx-p", outcomes, errors=[ForkTreeError(index=5, error="no capacity")])
    report = bisect("sbx-p", "cmd", fake_api(parent, []), count=6)
    assert report.count == 4  # 6 asked, 1 not created, 1 could not run the command
    assert report.reproduced == 2  # the exit 1 and the timeout
    body = report.to_json()
    assert [c["id"] for c in body["failed_children"]] == ["sbx-child2"]
    assert body["create_errors"] == ["child 5: no capacity"]
    assert any(c.get("timed_out") for c in body["children"])
    text = report.render()
    assert "2/4 reproduced" in text
    assert "excluded from the denominator" in text and "no capacity" in text and "agent went away" in text


def test_children_run_concurrently() -> None:
    barrier = threading.Barrier(4, timeout=5)

    class Waiting(FakeChild):
        def exec(self, cmd: str, *, timeout_seconds: float | None = 60.0) -> Result:
            barrier.wait()  # only returns once all four run at the same time
            return Result(0)

    runs = run_children([Waiting(f"c{i}", 0) for i in range(4)], "true", 10)
    assert [r.exit_code for r in runs] == [0, 0, 0, 0]


def test_empty_report() -> None:
    report = BisectReport("sbx", "true", 2, [ChildRun("c", None, 1.0, error="x")])
    assert report.count == 0 and report.reproduced == 0
    assert report.render().startswith("0/0 reproduced (no child ran the command)")


# --- debug ---------------------------------------------------------------------------------------------


class FakeMachine:
    """Answers the commands ``collect`` runs from a table of (prefix -> (exit code, stdout))."""

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.id = "sbx-restored"
        self.answers = answers
        self.killed = False
        self.closed = False

    def exec(self, cmd: str, *, timeout_seconds: float | None = 60.0) -> Result:
        for prefix, (rc, out) in self.answers.items():
            if cmd.startswith(prefix):
                return Result(rc, out)
        return Result(1, "")

    def kill(self) -> None:
        self.killed = True

    def close(self) -> None:
        self.closed = True


HANG = '{"kind": "hang", "pid": 42, "command": "pytest", "exit_code": null, "seed": 7}'


def hung_machine() -> FakeMachine:
    return FakeMachine(
        {
            "cat /failure.json": (0, HANG),
            "ps -eo": (0, "  PID STAT WCHAN ELAPSED CMD\n   42 S pipe_read 00:10 python3\n"),
            "test -f /work/.cryobox/test.log": (0, "FAILED test_x\n"),
            "test -d /proc/42": (0, ""),
            "sed -n 's/^State": (0, "S (sleeping)\n"),
            "cat /proc/42/wchan": (0, "pipe_read\n"),
            "cat /proc/42/stack": (0, "[<0>] pipe_read+0x2f0/0x480\n[<0>] vfs_read+0x2b/0x360\n"),
            "ls -l /proc/42/fd": (0, "lr-x------ 1 root root 64 0 -> pipe:[1234]\n"),
            "tr ": (0, "python3 -c hang"),
        }
    )


def test_debug_report_for_a_hang() -> None:
    machine = hung_machine()
    report = collect(machine, "snap-1")
    assert report.failure is not None and report.failure["kind"] == "hang"
    assert report.stuck is not None
    assert report.stuck["state"].startswith("S")
    assert "pipe_read" in report.stuck["stack"] and report.stuck["wchan"] == "pipe_read"
    assert report.log_tail == "FAILED test_x\n"
    body = report.to_json()
    assert {"sandbox_id", "failure", "ps", "log_tail", "stuck"} <= set(body)
    assert set(body["stuck"]) >= {"pid", "state", "wchan", "stack", "fds"}
    text = report.render()
    assert "kernel stack of 42" in text and "pipe:[1234]" in text


def test_debug_without_failure_record_or_log() -> None:
    report = collect(FakeMachine({"ps -eo": (0, "PID\n")}), "snap-2")
    assert report.failure is None and report.stuck is None and report.log_tail is None
    assert report.notes


@pytest.mark.parametrize("keep", [False, True])
def test_debug_kills_the_copy_unless_kept(keep: bool) -> None:
    machine = hung_machine()
    shells: list[str] = []
    shown: list[Any] = []
    run_debug("snap-1", lambda snap: machine, keep=keep, shell=shells.append, show=shown.append)
    assert shells == ["sbx-restored"] and len(shown) == 1
    assert machine.killed is (not keep) and machine.closed is keep


def test_pty_url() -> None:
    assert pty_url("http://h:8080/", "sbx-1", 100, 30) == "ws://h:8080/v1/sandboxes/sbx-1/pty?cols=100&rows=30"
    assert pty_url("https://h", "s", 1, 2, "/bin/sh").startswith("wss://h/v1/sandboxes/s/pty?cols=1&rows=2&cmd=")


# --- the --shell client against a fake pty websocket ------------------------------------------------------


class FakePtyServer:
    """Plays ``GET /v1/sandboxes/{id}/pty``: a prompt, then records input until a ``q`` or ^D."""

    def __init__(self) -> None:
        self.seen: list[str | bytes] = []
        self.requests: list[tuple[str, str | None]] = []
        self.refuse = False
        self.server = serve(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.requests.append((ws.request.path, ws.request.headers.get("authorization")))
        if self.refuse:
            ws.send(json.dumps({"error": "sandbox 'sbx-3' not found", "code": "not_found"}))
            ws.close(code=4404)
            return
        ws.send(json.dumps({"session": "pty-x"}))
        ws.send(b"$ ")
        for message in ws:
            self.seen.append(message)
            if isinstance(message, bytes) and (b"q" in message or b"\x04" in message):
                ws.send(b"bye\r\n")
                ws.send(json.dumps({"exit_code": 3}))
                ws.close()
                return

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture
def pty_server() -> Iterator[FakePtyServer]:
    fake = FakePtyServer()
    yield fake
    fake.close()


class TtyOut(io.BytesIO):
    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def test_shell_on_a_terminal_is_raw_and_restored(pty_server: FakePtyServer) -> None:
    master, slave = os.openpty()
    try:
        saved = termios.tcgetattr(slave)
        os.write(master, b"ab")  # typed ahead: must not be flushed by the switch to raw mode
        typist = threading.Timer(0.5, lambda: os.write(master, b"q"))
        typist.start()
        stdin = os.fdopen(slave, "rb", buffering=0, closefd=False)
        out = TtyOut(slave)
        assert open_shell(pty_server.url, "key-1", "sbx-1", stdin=stdin, stdout=out) == 3
        typist.join()
        assert termios.tcgetattr(slave) == saved
    finally:
        os.close(master)
        os.close(slave)
    assert out.getvalue() == b"$ bye\r\n"
    assert pty_server.requests == [("/v1/sandboxes/sbx-1/pty?cols=80&rows=24", "Bearer key-1")]
    assert pty_server.seen == [b"ab", b"q"]


def test_shell_with_piped_input_sends_lines_then_eof(pty_server: FakePtyServer) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"echo one\necho two\n")
    os.close(write_end)
    out = io.BytesIO()
    with os.fdopen(read_end, "rb") as stdin:
        assert open_shell(pty_server.url, "", "sbx-2", stdin=stdin, stdout=out, exit_timeout_s=5) == 3
    assert pty_server.seen == [b"echo one\n", b"echo two\n", b"\x04"]
    assert pty_server.requests[0][1] is None  # no key, no header


def test_shell_reports_server_errors(pty_server: FakePtyServer) -> None:
    pty_server.refuse = True
    with pytest.raises(ShellError) as caught:
        open_shell(pty_server.url, "k", "sbx-3", stdin=io.BytesIO(b""), stdout=io.BytesIO())
    assert caught.value.code == "not_found"
