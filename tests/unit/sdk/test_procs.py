"""SDK: background processes, directory watches and port URLs, async and sync, against the real app (a uvicorn
server on 127.0.0.1 in the test's event loop) over the fake agent (see ``tests.support.shell.ShellAgent``).

The sync client blocks, so its calls run in a worker thread while the loop serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import AsyncIterator
from typing import assert_type
from urllib.parse import urlsplit

import pytest

from cryobox import (
    AsyncProcess,
    AsyncProcesses,
    AsyncSandbox,
    ExecResult,
    FsWatchEvent,
    InvalidArgument,
    NotFound,
    Process,
    Processes,
    ProcessResult,
    Sandbox,
    SandboxTimeout,
    StreamEvent,
    models,
)
from cryobox.agentapi import models as am
from tests.support.app import Env, env, quota, registry
from tests.support.serving import served
from tests.support.shell import ShellAgent, agent, eventually, sid

__all__ = ["agent", "env", "quota", "registry", "served", "sid"]  # fixtures


@pytest.fixture
def key(env: Env) -> str:
    return env.client.headers["Authorization"].split()[1]


@pytest.fixture
async def sbx(served: str, key: str, sid: str) -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.connect(sid, api_url=served, api_key=key, timeout_s=10)
    yield sandbox
    await sandbox.aclose()


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(Process, AsyncProcess), (Processes, AsyncProcesses)])
def test_same_methods_as_sync(sync_cls: type, async_cls: type) -> None:
    assert _public(async_cls) == _public(sync_cls)
    for name in _public(async_cls):
        attr = inspect.getattr_static(async_cls, name)
        if not isinstance(attr, property):
            assert inspect.iscoroutinefunction(attr) or inspect.isasyncgenfunction(attr), name


# --- async ------------------------------------------------------------------------------------------------------


async def test_start_wait_list_connect(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    proc = await sbx.processes.start("echo hi", env={"A": "1"}, cwd="/w", tag="t")
    assert isinstance(proc, AsyncProcess) and proc.tag == "t" and proc.info.cmd == "echo hi"
    asked = agent.started[-1]
    assert (asked.args, asked.env, asked.cwd, asked.tag, asked.stdin) == (
        ["-c", "echo hi"],
        {"A": "1"},
        "/w",
        "t",
        False,
    )
    result = await proc.wait(timeout_seconds=5)
    assert result == ProcessResult(pid=proc.pid, exit_code=0, status="exit status 0", stdout="hi\n", stderr="")
    sleeper = await sbx.processes.start("sleep 100")
    listed = await sbx.processes.list()
    assert all(isinstance(p, models.Process) for p in listed)
    assert {(p.pid, p.running) for p in listed} == {(proc.pid, False), (sleeper.pid, True)}
    again = await sbx.processes.connect(proc.pid)
    assert (again.pid, again.tag, again.info.exit_code) == (proc.pid, "t", 0)
    with pytest.raises(NotFound):
        await sbx.processes.connect(99999)
    assert "AsyncProcess(pid=" in repr(again)


async def test_stream_replays_then_follows_with_callbacks(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    proc = await sbx.processes.start("cat", stdin=True)
    await proc.send_stdin("early\n")  # before the stream: replayed
    seen: list[str] = []
    events: list[StreamEvent] = []
    async with contextlib.aclosing(proc.stream(on_stdout=seen.append)) as stream:
        async for event in stream:
            events.append(event)
            if len(events) == 1:
                await proc.send_stdin(b"\xff")
                await proc.close_stdin()
    assert events == [
        StreamEvent(kind="stdout", chunk="early\n"),
        StreamEvent(kind="stdout", chunk="\ufffd"),
        StreamEvent(kind="exit", exit_code=0),
    ]
    assert seen == ["early\n", "\ufffd"]
    failed = await sbx.processes.start("fail")
    errors: list[str] = []
    assert [e.kind async for e in failed.stream(on_stderr=errors.append)] == ["stderr", "exit"]
    assert errors == ["bad\n"]


async def test_closing_a_stream_only_detaches(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    proc = await sbx.processes.start("cat", stdin=True)
    await proc.send_stdin("x")
    closed = agent.proc_streams_closed
    async with contextlib.aclosing(proc.stream()) as stream:
        async for event in stream:
            assert event.chunk == "x"
            break
    await eventually(lambda: agent.proc_streams_closed > closed)
    assert agent.procs[sbx.id][proc.pid].ended is None


async def test_exec_background_returns_a_process(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    proc = await sbx.exec("cat", background=True, stdin="abc")
    assert_type(proc, AsyncProcess)
    assert agent.started[-1].stdin is True
    assert (await proc.wait()).stdout == "abc"
    quiet = await sbx.exec("sleep 100", background=True)
    assert agent.started[-1].stdin is False and agent.procs[sbx.id][quiet.pid].ended is None
    plain = await sbx.exec("echo x")
    assert_type(plain, ExecResult)
    assert plain.stdout == "x\n" and len(agent.started) == 2  # a foreground exec is no background process


async def test_signal_kill_and_bad_signals(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    term = await sbx.processes.start("sleep 100")
    await term.signal("SIGTERM")
    assert await term.wait() == ProcessResult(pid=term.pid, exit_code=-1, status="signal: 15")
    usr1 = await sbx.processes.start("sleep 100")
    await usr1.signal(signal.SIGUSR1)
    killed = await sbx.processes.start("sleep 100")
    await killed.kill()
    assert agent.signals() == [15, 10, 9]
    with pytest.raises(NotFound):
        await killed.kill()  # it has ended
    sent = len(agent.signals())
    for bad in ("NOPE", 0, 65):
        with pytest.raises(InvalidArgument):
            await term.signal(bad)
    assert len(agent.signals()) == sent  # refused before sending


async def test_wait_timeout_raises_and_the_process_runs_on(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    proc = await sbx.processes.start("cat", stdin=True)
    await proc.send_stdin("so far")
    with pytest.raises(SandboxTimeout) as raised:
        await proc.wait(timeout_seconds=0.2)
    assert raised.value.details["stdout"] == "so far" and raised.value.details["pid"] == proc.pid
    assert agent.procs[sbx.id][proc.pid].ended is None


async def test_watch_yields_events_and_closing_ends_it(sbx: AsyncSandbox, agent: ShellAgent) -> None:
    async with contextlib.aclosing(sbx.filesystem.watch("/work", recursive=True)) as events:
        assert await anext(events) == FsWatchEvent(kind="start")
        assert agent.calls[-1] == ("fs_watch", (sbx.id, am.WatchRequest(path="/work", recursive=True)))
        agent.watch_queues[sbx.id].put_nowait(am.FsEvent(kind="write", name="notes.txt"))
        assert await anext(events) == FsWatchEvent(kind="write", name="notes.txt")
    await eventually(lambda: sbx.id not in agent.watch_queues)
    agent.fail_next["fs_watch"] = NotFound("no directory /nope")
    with pytest.raises(NotFound, match="no directory /nope"):
        await anext(sbx.filesystem.watch("/nope"))


async def test_port_urls(sbx: AsyncSandbox, served: str) -> None:
    base = f"{served}/v1/sandboxes/{sbx.id}/ports"
    assert sbx.port_url(3000) == f"{base}/3000/"
    assert sbx.port_url(8080, "/api?x=1") == f"{base}/8080/api?x=1"
    assert sbx.port_url(80, "health") == f"{base}/80/health"
    assert sbx.get_host(3000) == f"{urlsplit(served).netloc}/v1/sandboxes/{sbx.id}/ports/3000"
    for bad in (0, 65536, -1):
        with pytest.raises(InvalidArgument):
            sbx.port_url(bad)


# --- sync -------------------------------------------------------------------------------------------------------


async def test_sync_processes(served: str, key: str, sid: str, agent: ShellAgent) -> None:
    def flow() -> tuple[list[StreamEvent], ProcessResult, Process, list[models.Process], str]:
        with contextlib.closing(Sandbox.connect(sid, api_url=served, api_key=key, timeout_s=10)) as sbx:
            proc = sbx.processes.start("cat", stdin=True, tag="sync")
            assert isinstance(proc, Process)
            proc.send_stdin("a")
            proc.send_stdin(b"b")
            proc.close_stdin()
            events = list(proc.stream())  # all replayed: it has ended
            result = sbx.processes.connect(proc.pid).wait(timeout_seconds=5)
            background = sbx.exec("sleep 100", background=True)
            assert_type(background, Process)
            background.signal("TERM")
            with pytest.raises(SandboxTimeout):
                sbx.processes.start("sleep 100").wait(timeout_seconds=0.1)
            return events, result, background, sbx.processes.list(), sbx.port_url(1, "/x")

    events, result, background, listed, url = await asyncio.to_thread(flow)
    assert events == [StreamEvent("stdout", "a"), StreamEvent("stdout", "b"), StreamEvent("exit", exit_code=0)]
    assert (result.exit_code, result.stdout) == (0, "ab")
    assert agent.signals() == [15] and agent.procs[sid][background.pid].ended is not None
    assert len(listed) == 3 and url == f"{served}/v1/sandboxes/{sid}/ports/1/x"


async def test_sync_watch(served: str, key: str, sid: str, agent: ShellAgent) -> None:
    loop = asyncio.get_running_loop()

    def flow() -> list[FsWatchEvent]:
        with contextlib.closing(Sandbox.connect(sid, api_url=served, api_key=key, timeout_s=10)) as sbx:
            events = sbx.filesystem.watch("/w")
            seen = [next(events)]
            event = am.FsEvent(kind="rename", name="a")
            loop.call_soon_threadsafe(agent.watch_queues[sid].put_nowait, event)
            seen.append(next(events))
            events.close()
            return seen

    assert await asyncio.to_thread(flow) == [FsWatchEvent("start"), FsWatchEvent("rename", "a")]
    await eventually(lambda: sid not in agent.watch_queues)
