"""envd's process service over real HTTP (uvicorn on 127.0.0.1), driven by connectrpc's client with the JSON codec
the E2B SDK uses, against an in-memory agent."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Literal, cast

import pytest
from connectrpc.code import Code
from connectrpc.codec import proto_json_codec
from connectrpc.errors import ConnectError
from protobuf import Oneof

from cryobox.compat.e2b.envd import EnvdApp, create_envd_app
from cryobox.compat.e2b.envd.gen.process import process_pb as pb
from cryobox.compat.e2b.envd.gen.process.process_connect import ProcessClient
from tests.support.envd import HEADERS, SANDBOX, FakeAccess, FakeEnvdAgent, mounted, no_forward, serve, until


@dataclass
class Env:
    agent: FakeEnvdAgent
    access: FakeAccess
    app: EnvdApp
    client: ProcessClient
    sleeps: list[float]
    gate: asyncio.Event


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    agent = FakeEnvdAgent()
    access = FakeAccess(agent)
    sleeps: list[float] = []
    gate = asyncio.Event()

    async def sleep(seconds: float) -> None:  # deadline kills wait for the test to open the gate
        sleeps.append(seconds)
        await gate.wait()

    app = create_envd_app(access, no_forward, sleep=sleep)
    async with serve(mounted(app)) as base:
        client = ProcessClient(
            f"{base}/e2b/sandbox", codec=proto_json_codec(), send_compression=None, accept_compression=()
        )
        try:
            yield Env(agent, access, app, client, sleeps, gate)
        finally:
            await app.aclose()


# -- building and reading messages ---------------------------------------------------------------------------
def config(cmd: str, *args: str, cwd: str | None = None) -> pb.ProcessConfig:
    return pb.ProcessConfig(cmd=cmd, args=list(args), envs={"A": "1"}, cwd=cwd)


def by_pid(pid: int) -> pb.ProcessSelector:
    selector: Oneof[Literal["pid"], int] = Oneof("pid", pid)
    return pb.ProcessSelector(selector=selector)


def by_tag(tag: str) -> pb.ProcessSelector:
    selector: Oneof[Literal["tag"], str] = Oneof("tag", tag)
    return pb.ProcessSelector(selector=selector)


def stdin(data: bytes) -> pb.ProcessInput:
    value: Oneof[Literal["stdin"], bytes] = Oneof("stdin", data)
    return pb.ProcessInput(input=value)


def pty_input(data: bytes) -> pb.ProcessInput:
    value: Oneof[Literal["pty"], bytes] = Oneof("pty", data)
    return pb.ProcessInput(input=value)


def stream_start(pid: int) -> pb.StreamInputRequest:
    event: Oneof[Literal["start"], pb.StreamInputRequest.StartEvent] = Oneof(
        "start", pb.StreamInputRequest.StartEvent(process=by_pid(pid))
    )
    return pb.StreamInputRequest(event=event)


def stream_data(data: bytes) -> pb.StreamInputRequest:
    event: Oneof[Literal["data"], pb.StreamInputRequest.DataEvent] = Oneof(
        "data", pb.StreamInputRequest.DataEvent(input=stdin(data))
    )
    return pb.StreamInputRequest(event=event)


def stream_keepalive() -> pb.StreamInputRequest:
    event: Oneof[Literal["keepalive"], pb.StreamInputRequest.KeepAlive] = Oneof(
        "keepalive", pb.StreamInputRequest.KeepAlive()
    )
    return pb.StreamInputRequest(event=event)


def user_header(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


async def collect(stream: AsyncIterator[pb.StartResponse] | AsyncIterator[pb.ConnectResponse]) -> list[pb.ProcessEvent]:
    return [r.event async for r in stream if r.event is not None]


def kind(event: pb.ProcessEvent | None) -> str:
    return event.event.field if event is not None and event.event is not None else ""


def output(events: list[pb.ProcessEvent]) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for event in events:
        match event.event:
            case Oneof(field="data", value=pb.ProcessEvent.DataEvent(output=Oneof(field=name, value=bytes() as data))):
                out.append((name, data))
    return out


def end_of(events: list[pb.ProcessEvent]) -> pb.ProcessEvent.EndEvent:
    match events[-1].event:
        case Oneof(field="end", value=pb.ProcessEvent.EndEvent() as end):
            return end
    raise AssertionError(f"no end event last in {events}")


def pid_of(response: pb.StartResponse | pb.ConnectResponse) -> int:
    match response.event.event if response.event is not None else None:
        case Oneof(field="start", value=pb.ProcessEvent.StartEvent() as start):
            return start.pid
    raise AssertionError(f"not a start event: {response}")


async def test_start_streams_start_output_and_end(env: Env) -> None:
    events = await collect(env.client.start(pb.StartRequest(process=config("echo", "hi", "there")), headers=HEADERS))
    assert [kind(e) for e in events] == ["start", "data", "end"]
    assert pid_of(pb.StartResponse(event=events[0])) == 100
    assert output(events) == [("stdout", b"hi there\n")]
    end = end_of(events)
    assert (end.exit_code, end.exited, end.status, end.has_field("error")) == (0, True, "exit status 0", False)
    spec = env.agent.starts[0]
    # the SDK named no user and no directory: the image's USER/WORKDIR if it has them, else E2B's "user"
    assert (spec.cmd, spec.args, spec.env, spec.user, spec.default_user, spec.cwd) == (
        "echo",
        ["hi", "there"],
        {"A": "1"},
        None,
        "user",
        None,
    )
    assert spec.stdin is True, "stdin absent in the request: envd's default is a pipe"
    await until(lambda: env.agent.closed_streams == 1)


async def test_failure_end_event_carries_error_and_stderr(env: Env) -> None:
    events = await collect(env.client.start(pb.StartRequest(process=config("fail"), stdin=False), headers=HEADERS))
    assert output(events) == [("stderr", b"bad\n")]
    end = end_of(events)
    assert (end.exit_code, end.exited, end.error) == (3, True, "exit status 3")
    assert env.agent.starts[0].stdin is False


async def test_user_cwd_tag_and_pty(env: Env) -> None:
    request = pb.StartRequest(
        process=config("echo", cwd="work"),
        pty=pb.PTY(size=pb.PTY.Size(cols=100, rows=30)),
        tag="my-tag",
    )
    events = await collect(env.client.start(request, headers={**HEADERS, **user_header("root")}))
    spec = env.agent.starts[0]
    assert (spec.user, spec.cwd, spec.tag) == ("root", "/root/work", "my-tag")
    assert spec.pty is not None and (spec.pty.cols, spec.pty.rows) == (100, 30)
    assert output(events) == [("pty", b"\n")]


async def test_wrong_token_is_unauthenticated_and_never_reaches_the_agent(env: Env) -> None:
    for headers in ({**HEADERS, "X-Access-Token": "nope"}, {k: v for k, v in HEADERS.items() if k != "X-Access-Token"}):
        with pytest.raises(ConnectError) as err:
            await collect(env.client.start(pb.StartRequest(process=config("echo")), headers=headers))
        assert err.value.code is Code.UNAUTHENTICATED
        with pytest.raises(ConnectError) as err:
            await env.client.list(pb.ListRequest(), headers=headers)
        assert err.value.code is Code.UNAUTHENTICATED
    assert env.agent.calls == []


async def test_gone_sandbox_is_unavailable_was_not_found(env: Env) -> None:
    headers = {**HEADERS, "E2b-Sandbox-Id": "sbx-gone", "X-Access-Token": "token-gone"}
    with pytest.raises(ConnectError) as err:
        await env.client.list(pb.ListRequest(), headers=headers)
    assert err.value.code is Code.UNAVAILABLE and "was not found" in err.value.message
    env.access.status = "paused"
    with pytest.raises(ConnectError) as err:
        await env.client.list(pb.ListRequest(), headers=HEADERS)
    assert err.value.code is Code.UNAVAILABLE and "was not found" in err.value.message


async def test_unknown_pid_is_not_found(env: Env) -> None:
    with pytest.raises(ConnectError) as err:
        await collect(env.client.connect(pb.ConnectRequest(process=by_pid(4242)), headers=HEADERS))
    assert err.value.code is Code.NOT_FOUND
    with pytest.raises(ConnectError) as err:
        await collect(env.client.connect(pb.ConnectRequest(process=by_tag("nope")), headers=HEADERS))
    assert err.value.code is Code.NOT_FOUND
    signal = pb.SendSignalRequest(process=by_pid(4242), signal=pb.Signal.SIGKILL)
    with pytest.raises(ConnectError) as err:
        await env.client.send_signal(signal, headers=HEADERS)
    assert err.value.code is Code.NOT_FOUND
    with pytest.raises(ConnectError) as err:
        await env.client.send_input(pb.SendInputRequest(process=by_pid(4242), input=stdin(b"x")), headers=HEADERS)
    assert err.value.code is Code.NOT_FOUND
    with pytest.raises(ConnectError) as err:
        await env.client.close_stdin(pb.CloseStdinRequest(process=by_pid(4242)), headers=HEADERS)
    assert err.value.code is Code.NOT_FOUND


async def test_invalid_requests(env: Env) -> None:
    with pytest.raises(ConnectError) as err:
        await collect(env.client.start(pb.StartRequest(process=pb.ProcessConfig()), headers=HEADERS))
    assert err.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(ConnectError) as err:
        await env.client.send_signal(pb.SendSignalRequest(process=by_pid(100)), headers=HEADERS)
    assert err.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(ConnectError) as err:
        await env.client.close_stdin(pb.CloseStdinRequest(), headers=HEADERS)
    assert err.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(ConnectError) as err:
        await env.client.send_input(pb.SendInputRequest(process=by_pid(100)), headers=HEADERS)
    assert err.value.code is Code.INVALID_ARGUMENT


async def test_stdin_echo_connect_list_and_close_stdin(env: Env) -> None:
    stream = env.client.start(pb.StartRequest(process=config("cat"), tag="cat-1", stdin=True), headers=HEADERS)
    pid = pid_of(await anext(stream))
    listed = await env.client.list(pb.ListRequest(), headers=HEADERS)
    assert [(p.pid, p.tag, p.config.cmd if p.config else None) for p in listed.processes] == [(pid, "cat-1", "cat")]
    await env.client.send_input(pb.SendInputRequest(process=by_pid(pid), input=stdin(b"ping\n")), headers=HEADERS)
    second = await anext(stream)
    assert output([second.event] if second.event else []) == [("stdout", b"ping\n")]
    # a second client attaches by tag and gets the buffered output replayed
    attached = env.client.connect(pb.ConnectRequest(process=by_tag("cat-1")), headers=HEADERS)
    assert pid_of(await anext(attached)) == pid
    await env.client.close_stdin(pb.CloseStdinRequest(process=by_pid(pid)), headers=HEADERS)
    replay = await collect(attached)
    assert output(replay) == [("stdout", b"ping\n")] and end_of(replay).exit_code == 0
    rest = await collect(stream)
    assert [kind(e) for e in rest] == ["end"]
    assert env.agent.inputs[-1].eof is True
    assert (await env.client.list(pb.ListRequest(), headers=HEADERS)).processes == []


async def test_stream_input_applies_chunks_in_order(env: Env) -> None:
    stream = env.client.start(pb.StartRequest(process=config("cat")), headers=HEADERS)
    pid = pid_of(await anext(stream))
    chunks = [f"chunk-{i};".encode() for i in range(40)]

    async def requests() -> AsyncIterator[pb.StreamInputRequest]:
        yield stream_start(pid)
        for i, chunk in enumerate(chunks):
            if i == 5:
                yield stream_keepalive()
            yield stream_data(chunk)

    await env.client.stream_input(requests(), headers=HEADERS)
    assert env.agent.procs[pid].inputs == chunks
    await env.client.close_stdin(pb.CloseStdinRequest(process=by_pid(pid)), headers=HEADERS)
    assert b"".join(data for _, data in output(await collect(stream))) == b"".join(chunks)


async def test_stream_input_without_start_is_invalid(env: Env) -> None:
    async def requests() -> AsyncIterator[pb.StreamInputRequest]:
        yield stream_data(b"x")

    with pytest.raises(ConnectError) as err:
        await env.client.stream_input(requests(), headers=HEADERS)
    assert err.value.code is Code.INVALID_ARGUMENT
    assert env.agent.inputs == []


async def test_large_input_is_split_in_order(env: Env) -> None:
    stream = env.client.start(pb.StartRequest(process=config("sleep")), headers=HEADERS)
    pid = pid_of(await anext(stream))
    data = bytes(range(256)) * (7 << 12)  # 7 MiB: two proc_input calls
    await env.client.send_input(pb.SendInputRequest(process=by_pid(pid), input=pty_input(data)), headers=HEADERS)
    assert len(env.agent.procs[pid].inputs) == 2 and b"".join(env.agent.procs[pid].inputs) == data
    await aclose(stream)


async def aclose(stream: AsyncIterator[pb.StartResponse] | AsyncIterator[pb.ConnectResponse]) -> None:
    """What the SDK's ``disconnect()`` does: connectrpc's streams are async generators."""
    await cast(AsyncGenerator[object, None], stream).aclose()


async def test_signal_and_resize(env: Env) -> None:
    request = pb.StartRequest(process=config("sleep"), pty=pb.PTY(size=pb.PTY.Size(cols=80, rows=24)))
    stream = env.client.start(request, headers=HEADERS)
    pid = pid_of(await anext(stream))
    await env.client.update(
        pb.UpdateRequest(process=by_pid(pid), pty=pb.PTY(size=pb.PTY.Size(cols=120, rows=40))), headers=HEADERS
    )
    assert [(r.size.cols, r.size.rows) for r in env.agent.resizes] == [(120, 40)]
    await env.client.send_signal(pb.SendSignalRequest(process=by_pid(pid), signal=pb.Signal.SIGTERM), headers=HEADERS)
    end = end_of(await collect(stream))
    assert (end.exit_code, end.exited, end.status, end.error) == (-1, False, "signal: terminated", "signal: terminated")
    assert env.agent.signals[0].signal == 15


async def test_client_disconnect_closes_the_agent_stream_and_the_process_keeps_running(env: Env) -> None:
    stream = env.client.start(pb.StartRequest(process=config("sleep")), headers=HEADERS)
    pid = pid_of(await anext(stream))
    await aclose(stream)
    await until(lambda: env.agent.closed_streams == 1)
    assert env.agent.procs[pid].ended is None
    listed = await env.client.list(pb.ListRequest(), headers=HEADERS)
    assert [p.pid for p in listed.processes] == [pid]


async def test_keepalives_in_quiet_gaps(env: Env) -> None:
    headers = {**HEADERS, "Keepalive-Ping-Interval": "0.05"}
    stream = env.client.start(pb.StartRequest(process=config("sleep")), headers=headers)
    kinds = []
    async for response in stream:
        kinds.append(kind(response.event))
        if len(kinds) == 3:
            break
    assert kinds == ["start", "keepalive", "keepalive"]
    await aclose(stream)
    await until(lambda: env.agent.closed_streams == 1)


async def test_no_keepalive_comes_before_the_start_event(env: Env) -> None:
    # the SDK takes the first event for the start event ("expected start event, got keepalive" otherwise): a
    # start that waits for the sandbox to wake stays silent until it has started
    env.agent.start_delay = 0.3
    headers = {**HEADERS, "Keepalive-Ping-Interval": "0.05"}
    stream = env.client.start(pb.StartRequest(process=config("sleep")), headers=headers)
    kinds = []
    async for response in stream:
        kinds.append(kind(response.event))
        if len(kinds) == 2:
            break
    assert kinds == ["start", "keepalive"]
    await aclose(stream)


async def test_deadline_kills_the_process_even_after_a_disconnect(env: Env) -> None:
    stream = env.client.start(pb.StartRequest(process=config("sleep")), headers=HEADERS, timeout_ms=30_000)
    pid = pid_of(await anext(stream))
    await aclose(stream)
    await until(lambda: len(env.sleeps) == 1)
    assert 25 < env.sleeps[0] <= 30
    assert env.agent.signals == []
    env.gate.set()
    await until(lambda: len(env.agent.signals) == 1)
    assert (env.agent.signals[0].process.pid, env.agent.signals[0].signal) == (pid, 9)


async def test_no_deadline_no_kill(env: Env) -> None:
    events = await collect(env.client.start(pb.StartRequest(process=config("echo")), headers=HEADERS))
    assert kind(events[-1]) == "end"
    assert env.sleeps == []
    assert SANDBOX in {opened for opened, _ in env.access.opened}
