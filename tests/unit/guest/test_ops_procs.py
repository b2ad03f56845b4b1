"""Background processes in-process: the agent serves one end of a socketpair, the test drives the other."""

from __future__ import annotations

import asyncio
import base64
import os
import pwd
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.guest import ops_procs
from cryobox.guest.agent import GuestAgent
from cryobox.guest.proc_io import BUFFER_BYTES, OutputLog, signal_status
from tests.support.guest import AsyncGuest, Harness, Mux, process_gone


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(GuestAgent(clock_setter=lambda ns: None))
    yield h
    h.agent.procs.kill_all()
    h.close()


@pytest.fixture
def mux(harness: Harness) -> Mux:
    return Mux(harness.client)


def start(mux: Mux, cmd: str, *args: str, **options: Any) -> int:
    pid: int = mux.ok("proc_start", {"cmd": cmd, "args": list(args), **options})["pid"]
    return pid


def sh(mux: Mux, script: str, **options: Any) -> int:
    return start(mux, "/bin/sh", "-c", script, **options)


def connect(mux: Mux, **sel: Any) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    req = mux.send("proc_connect", sel)
    final = mux.final(req)
    assert final["ok"] is True, final
    return mux.events(req), final["result"]


def output(events: list[tuple[str, bytes]], kind: str) -> bytes:
    return b"".join(data for event, data in events if event == kind)


def listed(mux: Mux, pid: int) -> dict[str, Any]:
    entry: dict[str, Any] = next(p for p in mux.ok("proc_list", {})["processes"] if p["pid"] == pid)
    return entry


def wait_ended(mux: Mux, pid: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (entry := listed(mux, pid))["running"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return entry


def test_detached_process_output_and_exit_code_via_connect(mux: Mux) -> None:
    pid = sh(mux, "echo out; echo err >&2; exit 3")
    events, final = connect(mux, pid=pid)
    assert events[0] == ("start", str(pid).encode())
    assert output(events, "stdout") == b"out\n" and output(events, "stderr") == b"err\n"
    assert final == {"pid": pid, "exit_code": 3, "status": "exit status 3", "exited": True}
    entry = listed(mux, pid)  # remembered after it ended
    assert entry["running"] is False and entry["exit_code"] == 3 and entry["status"] == "exit status 3"


def test_attach_streams_start_output_and_final(mux: Mux) -> None:
    req = mux.send("proc_start", {"cmd": "/bin/sh", "args": ["-c", "printf 'a\\0b'; exit 0"], "attach": True})
    final = mux.final(req)
    events = mux.events(req)
    pid = int(events[0][1])
    assert events[0][0] == "start" and output(events, "stdout") == b"a\0b"
    assert final["result"] == {"pid": pid, "exit_code": 0, "status": "exit status 0", "exited": True}


def test_a_forgotten_attached_process_is_not_listed_once_it_ended(mux: Mux) -> None:
    """The host's pool warm-up runs a login shell this way: nothing of it is listed in the sandbox it becomes."""
    kept = sh(mux, "exit 0")
    wait_ended(mux, kept)
    req = mux.send("proc_start", {"cmd": "/bin/sh", "args": ["-c", "echo warm"], "attach": True, "forget": True})
    final = mux.final(req)
    events = mux.events(req)
    pid = int(events[0][1])
    assert output(events, "stdout") == b"warm\n" and final["result"]["exit_code"] == 0
    pids = [p["pid"] for p in mux.ok("proc_list", {})["processes"]]
    assert pid not in pids and kept in pids  # the control: an ended process stays listed
    refused = mux.final(mux.send("proc_start", {"cmd": "/bin/true", "forget": True}))
    assert refused["ok"] is False and "attach" in refused["error"]["message"], refused


def test_cancelled_attach_detaches_and_connect_replays_everything_byte_exact(mux: Mux, tmp_path: Path) -> None:
    payload = os.urandom(700_000)
    (tmp_path / "payload").write_bytes(payload)
    script = f"echo first; sleep 0.5; cat {tmp_path / 'payload'}; sleep 0.3; echo last >&2"
    req = mux.send("proc_start", {"cmd": "/bin/sh", "args": ["-c", script], "attach": True, "tag": "job"})
    events = mux.wait_events(req, lambda evs: output(evs, "stdout") == b"first\n")
    pid = int(events[0][1])
    assert mux.ok("cancel", {"request": req}) == {"cancelled": True}
    assert mux.final(req)["result"] == {"pid": pid, "detached": True}
    assert listed(mux, pid)["running"] is True  # detached, not killed
    assert mux.ok("cancel", {"request": req}) == {"cancelled": False}  # it ended: nothing left to cancel

    events, final = connect(mux, tag="job")
    assert events[0] == ("start", str(pid).encode())
    assert "dropped" not in [e for e, _ in events]
    assert output(events, "stdout") == b"first\n" + payload
    assert output(events, "stderr") == b"last\n"
    assert all(len(data) <= 64 * 1024 for _, data in events)
    assert final["exit_code"] == 0 and final["exited"] is True
    # a late connect to the ended process replays it all again
    again, final_again = connect(mux, pid=pid)
    assert output(again, "stdout") == b"first\n" + payload and final_again == final


def test_buffer_drops_the_oldest_output_and_says_how_much(mux: Mux) -> None:
    total = 3 * 1024 * 1024
    pid = start(mux, "head", "-c", str(total), "/dev/zero")
    wait_ended(mux, pid)
    events, final = connect(mux, pid=pid)
    assert events[0][0] == "start" and events[1][0] == "dropped"
    dropped = int(events[1][1])
    replayed = output(events, "stdout")
    assert dropped > 0 and dropped + len(replayed) == total
    assert BUFFER_BYTES - 2 * 64 * 1024 <= len(replayed) <= BUFFER_BYTES
    assert final["exit_code"] == 0


def test_output_log_coalesces_and_bounds_tiny_chunks() -> None:
    log = OutputLog(limit=10_000)
    for i in range(5000):
        log.append("stdout" if i % 2 else "stderr", b"x")  # alternating: no merging possible
    assert log.end == 5000 and log.dropped > 0 and len(log.chunks) < 100
    pieces, cursor, skipped = log.read(0)
    assert skipped == log.dropped and cursor == 5000 and sum(len(d) for _, d in pieces) == 5000 - log.dropped
    merged = OutputLog()
    for _ in range(100):
        merged.append("stdout", b"abc")
    assert len(merged.chunks) == 1
    full = OutputLog()
    for _ in range(3):
        full.append("stdout", b"y" * 50_000)
    assert [len(c.data) for c in full.chunks] == [65536, 65536, 18928]  # chunks are filled up first
    assert b"".join(d for _, d in full.read(0)[0]) == b"y" * 150_000
    pieces, cursor, skipped = merged.read(150)  # a follower in the middle of the merged chunk
    assert pieces == [("stdout", b"abc" * 50)] and cursor == 300 and skipped == 0


def test_signal_kills_the_whole_process_group(mux: Mux) -> None:
    req = mux.send("proc_start", {"cmd": "/bin/sh", "args": ["-c", "sleep 60 & echo $!; wait"], "attach": True})
    events = mux.wait_events(req, lambda evs: output(evs, "stdout").endswith(b"\n"))
    pid, bg_pid = int(events[0][1]), int(output(events, "stdout"))
    assert mux.ok("proc_signal", {"pid": pid, "signal": int(signal.SIGKILL)}) == {}
    final = mux.final(req)["result"]
    assert final == {"pid": pid, "exit_code": -1, "status": "signal: killed", "exited": True}
    deadline = time.monotonic() + 5
    while not process_gone(bg_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process_gone(bg_pid), "the background child in the same group survived"
    assert mux.code("proc_signal", {"pid": pid, "signal": 15}) == "not_found"


def test_sigterm_status(mux: Mux) -> None:
    pid = start(mux, "sleep", "30", tag="sleeper")
    assert mux.ok("proc_signal", {"tag": "sleeper", "signal": 15}) == {}
    _, final = connect(mux, tag="sleeper")
    assert final == {"pid": pid, "exit_code": -1, "status": "signal: terminated", "exited": True}


def test_signal_status_strings() -> None:
    assert signal_status(0) == (0, "exit status 0")
    assert signal_status(-int(signal.SIGINT)) == (-1, "signal: interrupt")
    assert signal_status(-int(signal.SIGSEGV)) == (-1, "signal: segmentation fault")
    assert signal_status(-int(signal.SIGXCPU)) == (-1, "signal: CPU time limit exceeded")
    assert signal_status(-40) == (-1, "signal: signal 40")


def test_stdin_pipe_input_and_eof(mux: Mux) -> None:
    pid = start(mux, "cat", stdin=True)
    assert mux.ok("proc_input", {"pid": pid, "data": base64.b64encode(b"hello\x00\n").decode()}) == {"written": 7}
    assert mux.ok("proc_input", {"pid": pid, "data": "", "eof": True}) == {"written": 0}
    events, final = connect(mux, pid=pid)
    assert output(events, "stdout") == b"hello\x00\n" and final["exit_code"] == 0
    assert mux.code("proc_input", {"pid": pid, "data": ""}) == "not_found"  # ended


def test_input_without_stdin_is_invalid(mux: Mux) -> None:
    pid = start(mux, "sleep", "30")
    assert mux.code("proc_input", {"pid": pid, "data": "eA=="}) == "invalid_argument"
    assert mux.code("proc_resize", {"pid": pid, "cols": 10, "rows": 10}) == "invalid_argument"
    pid2 = start(mux, "sleep", "30", stdin=True)  # runs on after its stdin was closed
    mux.ok("proc_input", {"pid": pid2, "data": "", "eof": True})
    assert mux.code("proc_input", {"pid": pid2, "data": "eA=="}) == "invalid_argument"


def test_pty_process_input_resize_and_controlling_tty(mux: Mux) -> None:
    req = mux.send(
        "proc_start", {"cmd": "/bin/sh", "pty": {"cols": 100, "rows": 30}, "attach": True, "env": {"A": "1"}}
    )
    pid = int(mux.wait_events(req, lambda evs: len(evs) >= 1)[0][1])
    entry = listed(mux, pid)
    assert entry["pty"] is True and entry["env"] == {"A": "1"} and entry["cmd"] == "/bin/sh"

    def send(text: str) -> None:
        assert mux.ok("proc_input", {"pid": pid, "data": base64.b64encode(text.encode()).decode()})["written"]

    send("stty size; tty -s && echo has-a-tty; echo T=$TERM\n")
    mux.wait_events(req, lambda evs: b"T=xterm-256color" in output(evs, "pty"))
    assert mux.ok("proc_resize", {"pid": pid, "cols": 132, "rows": 43}) == {"cols": 132, "rows": 43}
    assert mux.code("proc_input", {"pid": pid, "data": "", "eof": True}) == "invalid_argument"
    send("stty size; exit 4\n")
    final = mux.final(req)["result"]
    text = output(mux.events(req), "pty")
    assert b"30 100" in text and b"43 132" in text and b"has-a-tty" in text
    assert {e for e, _ in mux.events(req)} == {"start", "pty"}
    assert final == {"pid": pid, "exit_code": 4, "status": "exit status 4", "exited": True}


def test_runs_as_another_user(mux: Mux) -> None:
    nobody = pwd.getpwnam("nobody")
    pid = sh(mux, 'id -u; id -g; echo "$HOME|$USER|$LOGNAME"; pwd', user="nobody")
    events, final = connect(mux, pid=pid)
    lines = output(events, "stdout").decode().splitlines()
    home_cwd = nobody.pw_dir if os.path.isdir(nobody.pw_dir) else "/"
    assert lines == [str(nobody.pw_uid), str(nobody.pw_gid), f"{nobody.pw_dir}|nobody|nobody", home_cwd]
    assert final["exit_code"] == 0
    assert mux.code("proc_start", {"cmd": "true", "user": "no-such-user-here"}) == "invalid_argument"


def test_env_cwd_and_list(mux: Mux, tmp_path: Path) -> None:
    pid = sh(mux, 'echo "$GREETING $(pwd)"; sleep 30', env={"GREETING": "hi"}, cwd=str(tmp_path), tag="t1")
    entry = listed(mux, pid)
    assert entry["tag"] == "t1" and entry["cmd"] == "/bin/sh" and entry["args"][0] == "-c"
    assert entry["env"] == {"GREETING": "hi"} and entry["cwd"] == str(tmp_path)
    assert entry["running"] is True and entry["exit_code"] is None and entry["pty"] is False
    assert abs(entry["started_at"] - time.time()) < 10
    assert mux.code("proc_start", {"cmd": "true", "tag": "t1"}) == "exists"
    req = mux.send("proc_connect", {"tag": "t1"})
    events = mux.wait_events(req, lambda evs: output(evs, "stdout").endswith(b"\n"))
    assert output(events, "stdout") == f"hi {tmp_path}\n".encode()
    mux.ok("proc_signal", {"tag": "t1", "signal": 9})
    assert mux.final(req)["result"]["status"] == "signal: killed"
    start(mux, "true", tag="t1")  # the tag is free once its process ended


def test_ended_processes_are_remembered_up_to_a_limit(mux: Mux, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_procs, "KEEP_EXITED", 2)
    pids = [start(mux, "true") for _ in range(3)]
    for pid in pids:
        deadline = time.monotonic() + 10
        while any(p["pid"] == pid and p["running"] for p in mux.ok("proc_list", {})["processes"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    remembered = {p["pid"] for p in mux.ok("proc_list", {})["processes"]}
    assert len(remembered & set(pids)) == 2
    monkeypatch.setattr(ops_procs, "KEEP_EXITED_SECONDS", 0.0)
    assert not {p["pid"] for p in mux.ok("proc_list", {})["processes"]} & set(pids)


def test_bad_arguments(mux: Mux, tmp_path: Path) -> None:
    assert mux.code("proc_start", {"cmd": "/no/such/program"}) == "not_found"
    assert mux.code("proc_start", {"cmd": "no-such-program-anywhere"}) == "not_found"
    assert mux.code("proc_start", {"cmd": "true", "cwd": str(tmp_path / "missing")}) == "not_found"
    assert mux.code("proc_start", {"cmd": ""}) == "invalid_argument"
    assert mux.code("proc_start", {"cmd": "true", "args": "x"}) == "invalid_argument"
    assert mux.code("proc_start", {"cmd": "true", "pty": {"cols": 0}}) == "invalid_argument"
    assert mux.code("proc_connect", {}) == "invalid_argument"
    assert mux.code("proc_connect", {"pid": 1, "tag": "x"}) == "invalid_argument"
    assert mux.code("proc_connect", {"pid": True}) == "invalid_argument"
    assert mux.code("proc_connect", {"pid": 999_999_999}) == "not_found"
    assert mux.code("proc_connect", {"tag": "nobody-uses-this"}) == "not_found"
    pid = start(mux, "sleep", "30")
    assert mux.code("proc_signal", {"pid": pid, "signal": 0}) == "invalid_argument"
    assert mux.code("proc_signal", {"pid": pid, "signal": 65}) == "invalid_argument"
    assert mux.code("proc_input", {"pid": pid, "data": "not base64!"}) == "invalid_argument"


async def test_guest_client_leaving_an_attached_stream_detaches_the_process() -> None:
    agent = GuestAgent(clock_setter=lambda ns: None)
    guest = AsyncGuest(agent)
    client = await guest.client()
    try:
        script = "echo one; sleep 0.4; echo two; sleep 0.2; echo three"
        stream = client.stream("proc_start", {"cmd": "/bin/sh", "args": ["-c", script], "attach": True})
        start_event = await asyncio.wait_for(anext(stream), 5)
        assert start_event["event"] == "start"
        pid = int(base64.b64decode(start_event["data"]))
        first = await asyncio.wait_for(anext(stream), 5)
        assert (first["event"], base64.b64decode(first["data"])) == ("stdout", b"one\n")
        await stream.aclose()  # type: ignore[attr-defined]
        listing = await client.call("proc_list")  # answered after the cancel frame that went out before it
        assert guest.cancels == [start_event["id"]]
        assert [p["running"] for p in listing["processes"] if p["pid"] == pid] == [True]  # still running

        out = b""
        async for message in client.stream("proc_connect", {"pid": pid}):
            if message["event"] == "stdout":
                out += base64.b64decode(message["data"])
            elif message["event"] == "result":
                assert message["result"] == {"pid": pid, "exit_code": 0, "status": "exit status 0", "exited": True}
        assert out == b"one\ntwo\nthree\n"
    finally:
        agent.procs.kill_all()
        await client.aclose()
        guest.close()
