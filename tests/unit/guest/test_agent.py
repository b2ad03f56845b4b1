"""Guest agent over a socketpair: the agent serves one end in a thread, a sync client drives the other."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.guest import ops_exec
from cryobox.guest.__main__ import find_port
from cryobox.guest.agent import GuestAgent
from cryobox.guest.protocol import HEADER
from tests.support.guest import AsyncGuest, Client, Harness, b64, process_gone


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


@pytest.fixture
def clock_calls() -> list[int]:
    return []


@pytest.fixture
def harness(clock_calls: list[int]) -> Iterator[Harness]:
    h = Harness(GuestAgent(clock_setter=clock_calls.append))
    yield h
    h.close()
    assert not h.thread.is_alive()


@pytest.fixture
def client(harness: Harness) -> Client:
    return harness.client


def exec_(client: Client, cmd: str, **args: Any) -> dict[str, Any]:
    return client.ok("exec", {"cmd": cmd, "timeout_seconds": 10, **args})


def test_ping(client: Client) -> None:
    result = client.ok("ping")
    assert result["pong"] is True
    assert result["pid"] == os.getpid()
    assert result["version"] == 1
    assert abs(result["time_ns"] - time.time_ns()) < 5 * 10**9


def test_exec_captures_output_and_exit_code(client: Client) -> None:
    started = time.monotonic()
    result = exec_(client, "echo out; sleep 0.05; echo err >&2; exit 3")
    round_trip_ms = (time.monotonic() - started) * 1000
    assert unb64(result["stdout"]) == b"out\n"
    assert unb64(result["stderr"]) == b"err\n"
    assert result["exit_code"] == 3
    assert result["timed_out"] is False and result["truncated"] is False
    assert result["duration_ms"] >= 0
    assert 50 <= result["duration_ms"] <= round_trip_ms  # the command's own run time (its sleep), within the call


def test_exec_signal_exit_code(client: Client) -> None:
    assert exec_(client, "kill -TERM $$")["exit_code"] == 128 + signal.SIGTERM


def test_exec_env_cwd_stdin(client: Client, tmp_path: Path) -> None:
    result = exec_(
        client,
        'printf "%s|%s|" "$GREETING" "$(pwd)"; cat; printf "|%s" "$HOME"',
        env={"GREETING": "hello"},
        cwd=str(tmp_path),
        stdin=b64(b"from stdin\x00\xff"),
    )
    home = os.environ.get("HOME", "/root").encode()
    assert unb64(result["stdout"]) == b"hello|" + str(tmp_path).encode() + b"|from stdin\x00\xff|" + home
    assert result["exit_code"] == 0


def test_exec_stdin_null_is_dev_null(client: Client) -> None:
    assert unb64(exec_(client, "wc -c")["stdout"]).strip() == b"0"


def test_exec_stream_events_in_order(client: Client) -> None:
    cmd = "for i in 1 2 3 4 5; do echo $i; echo e$i >&2; sleep 0.05; done"
    frames = client.call_full("exec", {"cmd": cmd, "stream": True, "timeout_seconds": 10})
    final, events = frames[-1], frames[:-1]
    assert final["ok"] is True and all("event" in e for e in events)
    assert final["result"]["stdout"] == "" and final["result"]["stderr"] == ""
    out = b"".join(unb64(e["data"]) for e in events if e["event"] == "stdout")
    err = b"".join(unb64(e["data"]) for e in events if e["event"] == "stderr")
    assert out == b"1\n2\n3\n4\n5\n"
    assert err == b"e1\ne2\ne3\ne4\ne5\n"
    # stdout line i+1 is printed 50 ms after stderr line i, so its event comes later
    order = [(e["event"], unb64(e["data"])) for e in events]
    for i in range(1, 5):
        first_err = next(n for n, (ev, d) in enumerate(order) if ev == "stderr" and f"e{i}".encode() in d)
        next_out = next(n for n, (ev, d) in enumerate(order) if ev == "stdout" and f"{i + 1}".encode() in d)
        assert first_err < next_out


def test_exec_timeout_kills_process_group(client: Client, tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    cmd = f"echo started; sh -c 'sleep 30 & echo $! > {pid_file}; sleep 30'"
    start = time.monotonic()
    result = client.ok("exec", {"cmd": cmd, "timeout_seconds": 0.5})
    assert time.monotonic() - start < 2.0
    assert result["timed_out"] is True
    assert result["exit_code"] == 137
    assert unb64(result["stdout"]) == b"started\n"
    bg_pid = int(pid_file.read_text())
    deadline = time.monotonic() + 2
    while not process_gone(bg_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process_gone(bg_pid)


def test_exec_background_grandchild_does_not_hang(client: Client) -> None:
    start = time.monotonic()
    result = exec_(client, "sleep 30 & echo $!")
    elapsed = time.monotonic() - start
    bg_pid = int(unb64(result["stdout"]))
    os.kill(bg_pid, signal.SIGKILL)
    assert elapsed < 2.0
    assert result["exit_code"] == 0 and result["timed_out"] is False


def test_exec_output_cap(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_exec, "MAX_CAPTURE", 1000)
    result = exec_(client, "head -c 5000 /dev/zero")
    assert result["truncated"] is True
    assert unb64(result["stdout"]) == b"\0" * 1000


def test_exec_invalid_arguments(client: Client, tmp_path: Path) -> None:
    assert client.error_code("exec", {}) == "invalid_argument"
    assert client.error_code("exec", {"cmd": 5}) == "invalid_argument"
    assert client.error_code("exec", {"cmd": "true", "timeout_seconds": -1}) == "invalid_argument"
    assert client.error_code("exec", {"cmd": "true", "cwd": "relative"}) == "invalid_argument"
    assert client.error_code("exec", {"cmd": "true", "cwd": str(tmp_path / "nope")}) == "not_found"


def test_binary_file_round_trip(client: Client, tmp_path: Path) -> None:
    for name, data in [("all.bin", bytes(range(256))), ("random.bin", os.urandom(1 << 20))]:
        path = tmp_path / "deep" / "er" / name
        written = client.ok("write_file", {"path": str(path), "content": b64(data), "mode": 0o600})
        assert written == {"path": str(path), "bytes": len(data)}
        assert path.read_bytes() == data
        assert path.stat().st_mode & 0o7777 == 0o600
        read = client.ok("read_file", {"path": str(path)})
        assert unb64(read["content"]) == data and read["size"] == len(data)
    assert sorted(os.listdir(tmp_path / "deep" / "er")) == ["all.bin", "random.bin"]  # no temp files left


def test_write_file_default_mode_and_directory_target(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    client.ok("write_file", {"path": str(path), "content": b64(b"x")})
    assert path.stat().st_mode & 0o7777 == 0o644
    assert client.error_code("write_file", {"path": str(tmp_path), "content": ""}) == "is_a_directory"


def test_list_dir_stat_mkdir_delete(client: Client, tmp_path: Path) -> None:
    client.ok("mkdir", {"path": str(tmp_path / "d" / "sub")})
    (tmp_path / "b.txt").write_bytes(b"12345")
    (tmp_path / "b.txt").chmod(0o640)
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    listing = client.ok("list_dir", {"path": str(tmp_path)})
    assert listing["path"] == str(tmp_path)
    names = [e["name"] for e in listing["entries"]]
    assert names == ["b.txt", "d", "dangling"]
    b = listing["entries"][0]
    assert (b["is_dir"], b["size"], b["mode"]) == (False, 5, 0o640)
    assert abs(b["mtime"] - (tmp_path / "b.txt").stat().st_mtime) < 1e-3
    assert listing["entries"][1]["is_dir"] is True

    st = client.ok("stat", {"path": str(tmp_path / "d")})
    assert st["name"] == "d" and st["is_dir"] is True and st["path"] == str(tmp_path / "d")

    assert client.ok("delete", {"path": str(tmp_path / "d")}) == {}
    assert client.ok("delete", {"path": str(tmp_path / "dangling")}) == {}
    assert client.ok("delete", {"path": str(tmp_path / "b.txt")}) == {}
    assert os.listdir(tmp_path) == []
    assert client.error_code("delete", {"path": str(tmp_path / "d")}) == "not_found"


def test_error_codes(client: Client, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert client.error_code("read_file", {"path": str(tmp_path / "missing")}) == "not_found"
    assert client.error_code("read_file", {"path": str(tmp_path)}) == "is_a_directory"
    assert client.error_code("read_file", {"path": "relative/path"}) == "invalid_argument"
    assert client.error_code("list_dir", {"path": str(tmp_path / "missing")}) == "not_found"
    assert client.error_code("list_dir", {"path": str(tmp_path / "f")}) == "not_a_directory"
    assert client.error_code("stat", {"path": str(tmp_path / "missing")}) == "not_found"
    assert client.error_code("mkdir", {"path": str(tmp_path / "f")}) == "exists"
    reply = client.call("frobnicate")
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_argument"
    assert "frobnicate" in reply["error"]["message"]


def test_unexpected_exception_is_internal_and_agent_survives(harness: Harness) -> None:
    def boom(args: dict[str, Any], emit: Any) -> dict[str, Any]:
        raise RuntimeError("kaboom")

    harness.agent.register("boom", boom)
    reply = harness.client.call("boom")
    assert reply["ok"] is False
    assert reply["error"] == {"code": "internal", "message": "RuntimeError: kaboom"}
    assert harness.client.ok("ping")["pong"] is True


def test_concurrent_requests(client: Client) -> None:
    slow = client.send("exec", {"cmd": "sleep 1", "timeout_seconds": 10})
    fast = client.send("ping")
    first = client.recv()
    second = client.recv()
    assert first["id"] == fast and first["ok"] is True
    assert second["id"] == slow and second["result"]["exit_code"] == 0


def test_set_clock_uses_injected_setter(client: Client, clock_calls: list[int]) -> None:
    before_real = time.time_ns()
    result = client.ok("set_clock", {"epoch_ns": 1_700_000_000_123_456_789})
    assert clock_calls == [1_700_000_000_123_456_789]
    assert before_real <= result["before_ns"] <= result["after_ns"] <= time.time_ns()
    assert client.error_code("set_clock", {"epoch_ns": "soon"}) == "invalid_argument"


def test_set_clock_permission_denied() -> None:
    def refuse(epoch_ns: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    reply = GuestAgent(clock_setter=refuse).handle({"id": 1, "op": "set_clock", "args": {"epoch_ns": 1}})
    assert reply["ok"] is False and reply["error"]["code"] == "permission_denied"


def test_peer_close_makes_serve_return(harness: Harness) -> None:
    harness.client.ok("ping")
    harness.client.sock.close()
    harness.thread.join(timeout=2)
    assert not harness.thread.is_alive()
    assert harness.served == [1]


def test_bad_frame_makes_serve_return(harness: Harness) -> None:
    harness.client.sock.sendall(HEADER.pack(0xFFFFFFFF))
    harness.thread.join(timeout=2)
    assert not harness.thread.is_alive()


def test_find_port_scans_sysfs(tmp_path: Path) -> None:
    sys_dir, dev_dir = tmp_path / "sys", tmp_path / "dev"
    dev_dir.mkdir()
    for name, port in [("vport0p1", "org.qemu.guest_agent.0"), ("vport1p1", "cryobox.agent")]:
        (sys_dir / name).mkdir(parents=True)
        (sys_dir / name / "name").write_text(port + "\n")
        (dev_dir / name).write_text("")
    missing = str(tmp_path / "no-such-link")
    assert find_port(missing, str(sys_dir), str(dev_dir)) == str(dev_dir / "vport1p1")
    link = tmp_path / "link"
    link.write_text("")
    assert find_port(str(link), str(sys_dir), str(dev_dir)) == str(link)
    assert find_port(missing, str(tmp_path / "nothing"), str(dev_dir)) is None


def test_a_port_nobody_is_behind_polls_as_away_without_consuming_anything() -> None:
    from cryobox.guest.hostwatch import host_away

    guest, host = socket.socketpair()
    try:
        assert not host_away(guest.fileno())
        host.sendall(b"x")
        assert not host_away(guest.fileno())  # data waiting is a host that is there
        assert guest.recv(1) == b"x"  # and the look took nothing
        host.close()
        assert host_away(guest.fileno())
    finally:
        guest.close()
        host.close()


def test_a_waiting_agent_sleeps_until_the_kernel_signals_its_port() -> None:
    """The guest agent's main thread waits for SIGIO on the port (no polling loop): nothing wakes it while nothing
    happens, and activity on the port does, at once, in this thread."""
    from cryobox.guest.hostwatch import block_sigio, watch_host

    previous = signal.getsignal(signal.SIGIO)
    guest, host = socket.socketpair()
    try:
        block_sigio()
        watch_host(guest.fileno())
        started = time.monotonic()
        assert signal.sigtimedwait([signal.SIGIO], 0.3) is None  # nothing happened: no wake-up
        assert time.monotonic() - started >= 0.29
        timer = threading.Timer(0.1, host.sendall, args=(b"x",))
        timer.start()
        started = time.monotonic()
        info = signal.sigtimedwait([signal.SIGIO], 10)
        timer.join()
        assert info is not None and info.si_signo == signal.SIGIO
        assert time.monotonic() - started < 5
    finally:
        guest.close()
        host.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGIO})
        signal.signal(signal.SIGIO, previous)


def test_a_hung_up_port_ends_the_session_instead_of_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A virtio-serial port whose host went away answers reads with EAGAIN and poll with POLLHUP at once: that
    ends the session (the caller backs off), it must not loop."""
    import select as select_mod

    from cryobox.guest import agent as agent_mod

    polls: list[int] = []

    class HungUp:
        def register(self, fd: int, mask: int) -> None:
            pass

        def poll(self) -> list[tuple[int, int]]:
            polls.append(1)
            assert len(polls) < 5, "spinning on a hung-up port"
            return [(7, select_mod.POLLHUP)]

    def again(fd: int, size: int) -> bytes:
        raise BlockingIOError

    monkeypatch.setattr(select_mod, "poll", HungUp)
    monkeypatch.setattr(os, "read", again)
    assert list(agent_mod.read_frames(7)) == []
    assert polls == [1]


class Spinner:
    """A streaming handler that runs until its request is cancelled."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()
        self.saw_cancel = False

    def __call__(self, args: dict[str, Any], emit: Any) -> dict[str, Any]:
        self.started.set()
        emit("tick", b"1")
        try:
            self.saw_cancel = emit.cancelled.wait(10)
            return {"spun": True}
        finally:
            self.ended.set()


def test_cancel_ends_a_stream_of_the_same_connection_only(clock_calls: list[int]) -> None:
    agent = GuestAgent(clock_setter=clock_calls.append)
    spinner = Spinner()
    agent.register("spin", spinner)
    a, b = Harness(agent), Harness(agent)
    try:
        req = a.client.send("spin")
        assert a.client.recv()["event"] == "tick"
        assert b.client.ok("cancel", {"request": req}) == {"cancelled": False}  # another connection's request
        assert a.client.ok("cancel", {"request": 12345}) == {"cancelled": False}  # no such request
        assert a.client.error_code("cancel", {}) == "invalid_argument"
        assert not spinner.ended.is_set()
        cancel = a.client.send("cancel", {"request": req})
        frames = {f["id"]: f for f in (a.client.recv(), a.client.recv())}
        assert frames[cancel]["result"] == {"cancelled": True}
        assert frames[req]["result"] == {"spun": True}
        assert spinner.saw_cancel and spinner.ended.wait(5)
        # ended: forgotten (the agent forgets it right after sending its reply, so allow it that moment)
        deadline = time.monotonic() + 5
        while a.client.ok("cancel", {"request": req}) != {"cancelled": False}:
            assert time.monotonic() < deadline, "an ended request is still cancellable"
            time.sleep(0.01)
    finally:
        a.close()
        b.close()


def test_closing_the_connection_cancels_its_running_requests(harness: Harness) -> None:
    spinner = Spinner()
    harness.agent.register("spin", spinner)
    harness.client.send("spin")
    assert harness.client.recv()["event"] == "tick"
    harness.client.sock.close()
    assert spinner.ended.wait(5) and spinner.saw_cancel


def test_existing_handlers_get_a_plain_callable_emit(harness: Harness) -> None:
    """``handle`` without a connection still gives handlers an emit with a cancel flag that is never set."""
    seen: list[Any] = []

    def probe(args: dict[str, Any], emit: Any) -> dict[str, Any]:
        emit("ignored", b"")
        seen.append(emit.cancelled.is_set())
        return {}

    harness.agent.register("probe", probe)
    assert harness.agent.handle({"id": 1, "op": "probe"})["ok"] is True
    assert seen == [False]


async def test_guest_client_cancels_a_stream_its_consumer_left() -> None:
    agent = GuestAgent(clock_setter=lambda ns: None)
    spinner = Spinner()
    agent.register("spin", spinner)
    guest = AsyncGuest(agent)
    client = await guest.client()
    try:
        stream = client.stream("spin", {})
        first = await asyncio.wait_for(anext(stream), 5)
        assert first["event"] == "tick"
        await stream.aclose()  # type: ignore[attr-defined]
        assert await asyncio.to_thread(spinner.ended.wait, 5)
        assert spinner.saw_cancel and guest.cancels == [first["id"]]

        # a consumer task that is cancelled mid-stream cancels its request too
        spinner2 = Spinner()
        agent.register("spin", spinner2)

        async def consume() -> None:
            async for _ in client.stream("spin", {}):
                pass

        task = asyncio.create_task(consume())
        assert await asyncio.to_thread(spinner2.started.wait, 5)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(spinner2.ended.wait, 5)
        assert spinner2.saw_cancel and len(guest.cancels) == 2

        # a stream read to its end sends no cancel
        events = [m async for m in client.stream("exec", {"cmd": "echo hi", "stream": True})]
        assert events[-1]["event"] == "result" and events[-1]["result"]["exit_code"] == 0
        assert (await client.call("ping"))["pong"] is True
        assert len(guest.cancels) == 2
    finally:
        await client.aclose()
        guest.close()
