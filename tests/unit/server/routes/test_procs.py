"""Background processes and directory watches over the public HTTP API, against the fake agent.

The fake agent's processes act on their ``cmd`` (``echo``, ``cat``, ``fail``, anything else sleeps); the routes
run every command as ``/bin/sh -c <cmd>``, so :class:`ShellAgent` plays the shell: it records the request the
routes sent and runs the command's first word as the fake's ``cmd``. Streams that must follow a live process
(or a watch) are read from a real uvicorn server on 127.0.0.1 (the ASGI transport buffers whole responses).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from cryobox.agentapi import models as am
from cryobox.errors import NotFound
from cryobox.models import ProcessResult
from cryobox.sdk._sse import SSEDecoder
from cryobox.server.routes.procs import process_view
from tests.support.app import Env, api, env, quota, registry
from tests.support.serving import served
from tests.support.shell import ShellAgent, agent, eventually, sid

__all__ = ["agent", "api", "env", "quota", "registry", "served", "sid"]  # fixtures

Event = tuple[str, dict[str, Any]]
Client = httpx.AsyncClient


@pytest.fixture
async def live(env: Env, served: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the served app, with the env's API key."""
    headers = {"Authorization": env.client.headers["Authorization"]}
    async with httpx.AsyncClient(base_url=served, headers=headers, timeout=10) as client:
        yield client


def sse_events(text: str) -> list[Event]:
    decoder = SSEDecoder()
    out = []
    for line in [*text.splitlines(), ""]:
        message = decoder.feed(line)
        if message is not None:
            out.append((message.event, json.loads(message.data)))
    return out


class Events:
    """Reads a live event stream one event at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()
        self._decoder = SSEDecoder()

    async def next(self) -> Event:
        async with asyncio.timeout(5):
            async for line in self._lines:
                message = self._decoder.feed(line)
                if message is not None:
                    return message.event, json.loads(message.data)
        raise AssertionError("the stream ended")


async def start(api: Client, sid: str, cmd: str, **body: Any) -> int:
    response = await api.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": cmd, **body})
    assert response.status_code == 201, response.text
    return int(response.json()["pid"])


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["error"]
    return body


# --- start, list, stream ----------------------------------------------------------------------------------------


async def test_start_runs_the_command_in_a_shell_and_detaches(api: Client, sid: str, agent: ShellAgent) -> None:
    body = {"cmd": "sleep 100", "env": {"A": "1"}, "cwd": "/tmp", "tag": "web", "stdin": True, "pty": {"cols": 100}}
    response = await api.post(f"/v1/sandboxes/{sid}/processes", json=body)
    assert response.status_code == 201, response.text
    made = response.json()
    assert made["cmd"] == "sleep 100" and made["tag"] == "web" and made["running"] is True
    assert made["exit_code"] is None and made["started_at"].endswith("Z")
    (asked,) = agent.started
    assert (asked.cmd, asked.args, asked.env, asked.cwd) == ("/bin/sh", ["-c", "sleep 100"], {"A": "1"}, "/tmp")
    assert asked.tag == "web"
    assert asked.stdin is True and asked.pty == am.PtySize(cols=100, rows=24)
    await eventually(lambda: agent.proc_streams_closed == 1)  # the start stream was closed: detached ...
    proc = agent.procs[sid][made["pid"]]
    assert proc.ended is None  # ... and the process runs on


async def test_list_shows_running_and_ended_processes(api: Client, sid: str) -> None:
    echo = await start(api, sid, "echo hello world")
    sleeper = await start(api, sid, "sleep 100", tag="bg")
    items = {p["pid"]: p for p in (await api.get(f"/v1/sandboxes/{sid}/processes")).json()["items"]}
    assert (items[echo]["running"], items[echo]["exit_code"], items[echo]["cmd"]) == (False, 0, "echo hello world")
    assert items[sleeper]["running"] is True and items[sleeper]["exit_code"] is None and items[sleeper]["tag"] == "bg"


def test_a_shell_process_is_listed_with_its_shell_string() -> None:
    info = am.ProcInfo(pid=7, cmd="/bin/sh", args=["-c", "cd /w && make"], started_at=0.0)
    assert process_view(info).cmd == "cd /w && make"
    assert process_view(info).started_at == "1970-01-01T00:00:00Z"
    other = am.ProcInfo(pid=8, cmd="python3", args=["-c", "print('x y')"], running=False, exit_code=2)
    view = process_view(other)
    assert view.cmd == "python3 -c 'print('\"'\"'x y'\"'\"')'" and view.exit_code == 2 and not view.running


async def test_stream_replays_the_output_of_an_ended_process(api: Client, sid: str, agent: ShellAgent) -> None:
    pid = await start(api, sid, "echo hi there")
    response = await api.get(f"/v1/sandboxes/{sid}/processes/{pid}/stream")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert sse_events(response.text) == [
        ("stdout", {"chunk": "hi there\n"}),
        ("exit", {"exit_code": 0, "status": "exit status 0"}),
    ]
    failed = await start(api, sid, "fail")
    events = sse_events((await api.get(f"/v1/sandboxes/{sid}/processes/{failed}/stream")).text)
    assert events == [("stderr", {"chunk": "bad\n"}), ("exit", {"exit_code": 3, "status": "exit status 3"})]
    assert agent.calls[-1][0] == "proc_connect" and agent.calls[-1][1][1] == am.ProcSelector(pid=failed)


async def test_stdin_to_cat_is_echoed_live_and_eof_ends_it(live: Client, sid: str, agent: ShellAgent) -> None:
    pid = await start(live, sid, "cat", stdin=True)
    base = f"/v1/sandboxes/{sid}/processes/{pid}"
    async with live.stream("GET", f"{base}/stream") as response:
        assert response.status_code == 200
        events = Events(response)
        assert (await live.post(f"{base}/stdin", json={"data": "ping\n"})).status_code == 204
        assert await events.next() == ("stdout", {"chunk": "ping\n"})
        # bytes, and a character split across two writes comes out whole
        for part in (b"\x00caf\xc3", b"\xa9!"):
            sent = await live.post(f"{base}/stdin", json={"data_b64": base64.b64encode(part).decode()})
            assert sent.status_code == 204, sent.text
        assert await events.next() == ("stdout", {"chunk": "\x00caf"})
        assert await events.next() == ("stdout", {"chunk": "é!"})
        assert (await live.post(f"{base}/stdin", json={"eof": True})).status_code == 204
        assert await events.next() == ("exit", {"exit_code": 0, "status": "exit status 0"})
    inputs = [args[1] for name, args in agent.calls if name == "proc_input"]
    assert [i.data_b64 for i in inputs] == [base64.b64encode(b"ping\n").decode(), "AGNhZsM=", "qSE=", ""]
    assert [i.eof for i in inputs] == [False, False, False, True]
    (listed,) = (await live.get(f"/v1/sandboxes/{sid}/processes")).json()["items"]
    assert listed["running"] is False and listed["exit_code"] == 0


async def test_closing_a_stream_detaches_and_the_process_keeps_running(
    live: Client, sid: str, agent: ShellAgent
) -> None:
    pid = await start(live, sid, "sleep 100")
    closed = agent.proc_streams_closed
    async with live.stream("GET", f"/v1/sandboxes/{sid}/processes/{pid}/stream") as response:
        assert response.status_code == 200
        await eventually(lambda: agent.call_names().count("proc_connect") == 1)
    await eventually(lambda: agent.proc_streams_closed == closed + 1)  # the agent stream was closed with it
    assert agent.procs[sid][pid].ended is None
    # a stream open while the process is signalled ends with its exit
    async with live.stream("GET", f"/v1/sandboxes/{sid}/processes/{pid}/stream") as response:
        events = Events(response)
        sent = await live.post(f"/v1/sandboxes/{sid}/processes/{pid}/signal", json={"signal": "INT"})
        assert sent.status_code == 204
        assert await events.next() == ("exit", {"exit_code": -1, "status": "signal: 2"})


async def test_a_failing_guest_stream_ends_with_an_error_event(api: Client, sid: str, agent: ShellAgent) -> None:
    pid = await start(api, sid, "sleep 100")
    agent.broken = "raise"
    events = sse_events((await api.get(f"/v1/sandboxes/{sid}/processes/{pid}/stream")).text)
    assert events == [
        ("stdout", {"chunk": "half "}),
        ("error", {"error": "the guest went away", "code": "guest_error"}),
    ]
    error(await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait"), 502, "guest_error")
    # an end without an exit code (the guest could not run it); the incomplete character is flushed first
    agent.broken = "end"
    events = sse_events((await api.get(f"/v1/sandboxes/{sid}/processes/{pid}/stream")).text)
    assert events[:2] == [("stdout", {"chunk": "half "}), ("stdout", {"chunk": "\ufffd"})]
    assert events[2][0] == "error" and "exec: no such file" in events[2][1]["error"] and len(events) == 3
    body = error(await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait"), 502, "guest_error")
    assert "exec: no such file" in body["error"]


async def test_stdin_refusals(api: Client, sid: str, agent: ShellAgent) -> None:
    pid = await start(api, sid, "cat", stdin=True)
    base = f"/v1/sandboxes/{sid}/processes/{pid}/stdin"
    error(await api.post(base, json={"data": "a", "data_b64": "YQ=="}), 400, "invalid_argument")
    error(await api.post(base, json={"data_b64": "not base64!"}), 400, "invalid_argument")
    error(await api.post(base, json={"eof": "maybe"}), 400, "invalid_argument")
    assert "proc_input" not in agent.call_names()  # refused before the agent
    sleeper = await start(api, sid, "sleep 5")
    error(await api.post(f"/v1/sandboxes/{sid}/processes/{sleeper}/stdin", json={"data": "x"}), 400, "invalid_argument")


# --- signals and wait -------------------------------------------------------------------------------------------


SIGNALS = [("SIGTERM", 15), ("TERM", 15), ("kill", 9), (2, 2), ("10", 10), (64, 64)]


@pytest.mark.parametrize(("given", "number"), SIGNALS)
async def test_signal_by_number_or_name(
    api: Client, sid: str, agent: ShellAgent, given: int | str, number: int
) -> None:
    pid = await start(api, sid, "sleep 100")
    response = await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/signal", json={"signal": given})
    assert response.status_code == 204, response.text
    assert agent.signals() == [number]
    result = (await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait")).json()
    assert ProcessResult(**result) == ProcessResult(pid=pid, exit_code=-1, status=f"signal: {number}")
    (listed,) = (await api.get(f"/v1/sandboxes/{sid}/processes")).json()["items"]
    assert listed["running"] is False and listed["exit_code"] == -1


@pytest.mark.parametrize("bad", ["SIGNOPE", "", 0, 65, -9, True, 1.5, None, "SIG"])
async def test_bad_signals_are_400_and_signal_nothing(api: Client, sid: str, agent: ShellAgent, bad: object) -> None:
    pid = await start(api, sid, "sleep 100")
    error(await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/signal", json={"signal": bad}), 400, "invalid_argument")
    assert agent.signals() == [] and agent.procs[sid][pid].ended is None


async def test_delete_kills(api: Client, sid: str, agent: ShellAgent) -> None:
    pid = await start(api, sid, "sleep 100")
    assert (await api.delete(f"/v1/sandboxes/{sid}/processes/{pid}")).status_code == 204
    assert agent.signals() == [9]
    assert (await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait")).json()["status"] == "signal: 9"
    error(await api.delete(f"/v1/sandboxes/{sid}/processes/{pid}"), 404, "not_found")  # it has ended


async def test_wait_collects_output_and_exit(api: Client, sid: str, agent: ShellAgent) -> None:
    echo = await start(api, sid, "echo one two")
    result = (await api.post(f"/v1/sandboxes/{sid}/processes/{echo}/wait", params={"timeout_seconds": 5})).json()
    assert ProcessResult(**result) == ProcessResult(echo, 0, "exit status 0", stdout="one two\n")
    failed = await start(api, sid, "fail")
    result = (await api.post(f"/v1/sandboxes/{sid}/processes/{failed}/wait")).json()
    assert ProcessResult(**result) == ProcessResult(failed, 3, "exit status 3", stderr="bad\n")


async def test_wait_timeout_is_504_with_the_output_so_far_and_the_process_runs_on(
    api: Client, sid: str, agent: ShellAgent
) -> None:
    pid = await start(api, sid, "cat", stdin=True)
    await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/stdin", json={"data": "partial"})
    closed = agent.proc_streams_closed
    response = await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait", params={"timeout_seconds": 0.2})
    body = error(response, 504, "timeout")
    assert "timed out" in body["error"]
    assert body["details"] == {"pid": pid, "stdout": "partial", "stderr": "", "timeout_seconds": 0.2}
    assert agent.proc_streams_closed == closed + 1 and agent.procs[sid][pid].ended is None
    zero = await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait", params={"timeout_seconds": 0})
    error(zero, 400, "invalid_argument")


# --- unknown processes and sandboxes ----------------------------------------------------------------------------


async def test_unknown_pid_is_404_everywhere(api: Client, sid: str, env: Env) -> None:
    other = await env.made()
    pid = await start(api, other, "sleep 100")  # a process of another sandbox is unknown here
    for response in (
        await api.get(f"/v1/sandboxes/{sid}/processes/{pid}/stream"),
        await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/wait"),
        await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/stdin", json={"data": "x"}),
        await api.post(f"/v1/sandboxes/{sid}/processes/{pid}/signal", json={"signal": 15}),
        await api.delete(f"/v1/sandboxes/{sid}/processes/{pid}"),
        await api.get(f"/v1/sandboxes/{sid}/processes/999999/stream"),
    ):
        error(response, 404, "not_found")
    assert env.agent.procs[other][pid].ended is None
    error(await api.get(f"/v1/sandboxes/{sid}/processes/0/stream"), 400, "invalid_argument")


async def test_unknown_sandbox_is_404_and_reaches_no_agent(api: Client, agent: ShellAgent) -> None:
    for response in (
        await api.post("/v1/sandboxes/sbx_nope/processes", json={"cmd": "echo"}),
        await api.get("/v1/sandboxes/sbx_nope/processes"),
        await api.get("/v1/sandboxes/sbx_nope/processes/100/stream"),
        await api.post("/v1/sandboxes/sbx_nope/processes/100/wait"),
        await api.get("/v1/sandboxes/sbx_nope/fs/watch", params={"path": "/work"}),
    ):
        error(response, 404, "not_found")
    assert not {"proc_start", "proc_list", "proc_connect", "fs_watch"} & set(agent.call_names())


async def test_invalid_start_requests_are_400(api: Client, sid: str, agent: ShellAgent) -> None:
    bad: list[dict[str, Any]] = [{"cmd": ""}, {}, {"cmd": "x", "env": {"A=B": "1"}}, {"cmd": "x", "tag": ""}]
    for body in [*bad, {"cmd": "x", "pty": {"cols": 0}}, {"cmd": "x", "cwd": ""}]:
        error(await api.post(f"/v1/sandboxes/{sid}/processes", json=body), 400, "invalid_argument")
    assert agent.started == []


# --- directory watches ------------------------------------------------------------------------------------------


async def test_watch_streams_changes_and_closing_ends_the_guest_watch(
    live: Client, sid: str, agent: ShellAgent
) -> None:
    params = {"path": "/work", "recursive": "true"}
    async with live.stream("GET", f"/v1/sandboxes/{sid}/fs/watch", params=params) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = Events(response)
        assert await events.next() == ("start", {"kind": "start", "name": ""})
        assert agent.calls[-1] == ("fs_watch", (sid, am.WatchRequest(path="/work", recursive=True)))
        agent.watch_queues[sid].put_nowait(am.FsEvent(kind="create", name="a/b.txt"))
        agent.watch_queues[sid].put_nowait(am.FsEvent(kind="remove", name="c"))
        assert await events.next() == ("create", {"kind": "create", "name": "a/b.txt"})
        assert await events.next() == ("remove", {"kind": "remove", "name": "c"})
    await eventually(lambda: sid not in agent.watch_queues)  # the client went away: the agent stream was closed


async def test_watch_refusals_are_plain_errors(api: Client, sid: str, agent: ShellAgent) -> None:
    error(await api.get(f"/v1/sandboxes/{sid}/fs/watch", params={"path": "work"}), 400, "invalid_argument")
    error(await api.get(f"/v1/sandboxes/{sid}/fs/watch"), 400, "invalid_argument")
    assert "fs_watch" not in agent.call_names()
    agent.fail_next["fs_watch"] = NotFound("no directory /nope")
    response = await api.get(f"/v1/sandboxes/{sid}/fs/watch", params={"path": "/nope"})
    assert error(response, 404, "not_found")["error"] == "no directory /nope"
