"""One contract for both agent transports: ``InProcessAgent(FakeAgent())`` and ``HttpAgent`` against
``create_agent_app(FakeAgent(), token)`` on a real uvicorn server (so streams really stream), plus the HTTP
transport's own duties (the node token, status codes, an unreachable agent)."""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from cryobox import models
from cryobox.agentapi import MAX_FILE_BYTES, Agent, HttpAgent, InProcessAgent, create_agent_app
from cryobox.agentapi import models as m
from cryobox.agentapi.models_templates import spec_from_request
from cryobox.errors import (
    CryoboxError,
    GuestError,
    HostUnavailable,
    IntegrityError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    StateError,
)
from cryobox.netpolicy import EgressPolicy
from tests.support.fake_agent import FakeAgent

TOKEN = "node-token-for-tests"
T = TypeVar("T")


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` on a real uvicorn server on 127.0.0.1 in a thread; yields its base URL."""
    # proto IPPROTO_TCP, or asyncio does not set TCP_NODELAY on accepted connections (40 ms per keep-alive call)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@dataclass
class Pair:
    agent: Agent
    fake: FakeAgent
    kind: str


@pytest.fixture(params=["inprocess", "http"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    fake = FakeAgent()
    if request.param == "inprocess":
        agent: Agent = InProcessAgent(fake)
        yield Pair(agent, fake, "inprocess")
        await agent.close()
        assert not fake.closed
        return
    with served(create_agent_app(fake, TOKEN)) as url:
        agent = HttpAgent(url, TOKEN, timeout_s=30, name="agent-1")
        yield Pair(agent, fake, "http")
        await agent.close()


@pytest.fixture
def http_fake() -> Iterator[tuple[str, FakeAgent]]:
    fake = FakeAgent()
    with served(create_agent_app(fake, TOKEN)) as url:
        yield url, fake


def spec(sandbox_id: str = "sb-1", **kw: Any) -> m.CreateSpec:
    return m.CreateSpec(sandbox_id=sandbox_id, template="base", workspace_id="ws-1", **kw)


async def collect(stream: AsyncIterator[T]) -> list[T]:
    return [item async for item in stream]


async def close_stream(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    assert aclose is not None
    await aclose()


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- the host ------------------------------------------------------------------------------------------------------


async def test_host_calls(pair: Pair) -> None:
    agent = pair.agent
    assert isinstance(agent, Agent)
    info = await agent.info()
    assert info.name == "fake" and info.boot_id == pair.fake.boot_id
    await agent.create(spec())
    capacity = await agent.capacity()
    assert capacity.sandboxes == 1 and capacity.vcpus_committed == 1
    assert capacity.templates_ready == {"base": "g1"}
    assert [t.name for t in await agent.templates()] == ["base"]
    assert b"cryobox_fake_sandboxes 1" in await agent.metrics_text()


# -- sandboxes -----------------------------------------------------------------------------------------------------


async def test_create_get_list_delete(pair: Pair) -> None:
    agent = pair.agent
    created = await agent.create(spec(metadata={"team": "a"}, env={"A": "1"}, ttl_s=60))
    assert created.state == "running" and created.metadata == {"team": "a"} and created.ttl_s == 60
    assert created.expires_at is not None
    assert (await agent.get("sb-1")).id == "sb-1"
    assert [s.id for s in await agent.list_sandboxes()] == ["sb-1"]
    assert pair.fake.calls[0][0] == "create" and pair.fake.calls[0][1][0] == spec(
        metadata={"team": "a"}, env={"A": "1"}, ttl_s=60
    )
    await agent.delete("sb-1")
    await agent.delete("sb-1")  # idempotent
    with pytest.raises(NotFound) as err:
        await agent.get("sb-1")
    assert err.value.details == {"sandbox_id": "sb-1"}
    assert await agent.list_sandboxes() == []


async def test_create_errors(pair: Pair) -> None:
    with pytest.raises(NotFound):
        await pair.agent.create(m.CreateSpec(sandbox_id="x", template="nope", workspace_id="w"))
    pair.fake.fail_next["create"] = HostUnavailable("queue full", retry_after_s=4.2, details={"queue": 9})
    with pytest.raises(HostUnavailable) as err:
        await pair.agent.create(spec())
    # whole seconds on HTTP (Retry-After), exact in-process
    assert err.value.retry_after_s == (5.0 if pair.kind == "http" else 4.2)
    assert err.value.details == {"queue": 9} and err.value.message == "queue full"


async def test_state_changes_and_state_error(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    assert (await agent.pause("sb-1")).state == "paused"
    with pytest.raises(StateError) as err:
        await agent.pause("sb-1")
    assert (err.value.state, err.value.required) == ("paused", "running")
    assert err.value.details == {"state": "paused", "required": "running"}
    assert (await agent.resume("sb-1")).state == "running"
    assert (await agent.hibernate("sb-1")).state == "hibernated"
    assert (await agent.hibernate("sb-1")).state == "hibernated"  # idempotent
    assert (await agent.wake("sb-1")).state == "running"
    assert (await agent.touch("sb-1")).last_active > 0
    patched = await agent.set_lifecycle("sb-1", m.LifecyclePatch(set_ttl=True, ttl_s=None, persistent=True))
    assert patched.ttl_s is None and patched.persistent and patched.expires_at is None
    for call in (agent.pause, agent.resume, agent.hibernate, agent.wake, agent.touch):
        with pytest.raises(NotFound):
            await call("missing")


# -- commands ------------------------------------------------------------------------------------------------------


async def test_exec(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec(env={"A": "1"}))
    assert (await agent.exec("sb-1", m.ExecRequest(cmd="echo hi"))).stdout == "hi\n"
    failed = await agent.exec("sb-1", m.ExecRequest(cmd="exit 3"))
    assert (failed.exit_code, failed.stderr) == (3, "exited 3\n")
    assert (await agent.exec("sb-1", m.ExecRequest(cmd="cat", stdin_b64=b64(b"in\x00put")))).stdout == "in\x00put"
    env = await agent.exec("sb-1", m.ExecRequest(cmd="env", env={"B": "2"}, timeout_s=None))
    assert env.stdout == "A=1\nB=2\n"
    with pytest.raises(HostUnavailable) as capacity:
        await agent.exec("sb-1", m.ExecRequest(cmd="capacity"))
    assert capacity.value.retry_after_s == 7
    with pytest.raises(GuestError):
        await agent.exec("sb-1", m.ExecRequest(cmd="fail"))
    with pytest.raises(NotFound):
        await agent.exec("missing", m.ExecRequest(cmd="true"))
    await agent.pause("sb-1")
    with pytest.raises(StateError):
        await agent.exec("sb-1", m.ExecRequest(cmd="true"))


async def test_exec_stream(pair: Pair) -> None:
    await pair.agent.create(spec())
    events = await collect(pair.agent.exec_stream("sb-1", m.ExecRequest(cmd="build")))
    assert [e.kind for e in events] == ["stdout", "stdout", "stdout", "exit"]
    assert events[0].text == "build 0\n"
    assert events[-1].result is not None and events[-1].result.stdout == "build\n"
    assert (await pair.agent.get("sb-1")).in_flight == 0


async def test_exec_stream_errors(pair: Pair) -> None:
    await pair.agent.create(spec())
    seen: list[m.ExecEvent] = []
    with pytest.raises(GuestError) as mid:
        async for event in pair.agent.exec_stream("sb-1", m.ExecRequest(cmd="fail-mid-stream")):
            seen.append(event)
    assert [e.text for e in seen] == ["starting\n"]
    assert mid.value.details == {"sandbox_id": "sb-1"}
    with pytest.raises(HostUnavailable) as before:
        await collect(pair.agent.exec_stream("sb-1", m.ExecRequest(cmd="capacity")))
    assert before.value.retry_after_s == 7
    with pytest.raises(HostUnavailable) as late:  # mid-stream: no Retry-After header, the line carries it
        await collect(pair.agent.exec_stream("sb-1", m.ExecRequest(cmd="capacity-mid-stream")))
    assert late.value.retry_after_s == 7 and late.value.details == {"agent": "fake"}
    with pytest.raises(NotFound):
        await collect(pair.agent.exec_stream("missing", m.ExecRequest(cmd="x")))


async def test_exec_stream_early_close(pair: Pair) -> None:
    await pair.agent.create(spec())
    stream = pair.agent.exec_stream("sb-1", m.ExecRequest(cmd="forever"))
    assert (await anext(stream)).text == "tick 0\n"
    assert (await anext(stream)).text == "tick 1\n"
    assert pair.fake.sandboxes["sb-1"].in_flight == 1
    await close_stream(stream)
    await eventually(lambda: len(pair.fake.closed_streams) == 1)
    await eventually(lambda: pair.fake.sandboxes["sb-1"].in_flight == 0)


# -- files, network, terminals -------------------------------------------------------------------------------------


async def test_files(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    data = bytes(range(256)) * 1000
    written = await agent.write_file("sb-1", "/work/data.bin", data)
    assert written == m.WriteResult(path="/work/data.bin", bytes=len(data))
    assert await agent.read_file("sb-1", "/work/data.bin") == data
    await agent.write_file("sb-1", "/work/empty", b"")
    assert await agent.read_file("sb-1", "/work/empty") == b""
    with pytest.raises(NotFound):
        await agent.read_file("sb-1", "/nope")
    made = await agent.file_op("sb-1", "mkdir", "/work/sub")
    assert made.model_dump() == {"path": "/work/sub"}  # the guest's keys, and only those, cross
    listing = await agent.file_op("sb-1", "list_dir", "/work")
    entries = listing.entries
    assert isinstance(entries, list) and [e.name for e in entries] == ["data.bin", "empty", "sub"]
    stat = await agent.file_op("sb-1", "stat", "/work/data.bin")
    assert stat.size == len(data) and stat.is_dir is False
    assert (await agent.file_op("sb-1", "delete", "/work/data.bin")).model_dump() == {}
    with pytest.raises(NotFound):
        await agent.read_file("sb-1", "/work/data.bin")
    with pytest.raises(InvalidArgument):
        await agent.file_op("sb-1", "chmod", "/work")
    with pytest.raises(InvalidArgument):
        await agent.write_file("sb-1", "relative", b"x")
    net = (await agent.inspect_net("sb-1")).model_dump()
    assert net["egress"] == ["*"] and net["ip"] == pair.fake.sandboxes["sb-1"].guest_ip


async def test_write_too_large(pair: Pair) -> None:
    await pair.agent.create(spec())
    with pytest.raises(PayloadTooLarge):
        await pair.agent.write_file("sb-1", "/big", bytes(MAX_FILE_BYTES + 1))
    if pair.kind == "http":  # refused by the server before the agent saw it
        assert "write_file" not in pair.fake.call_names()
    with pytest.raises(NotFound):
        await pair.agent.read_file("sb-1", "/big")


async def test_pty(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    stream = agent.pty_open("sb-1", m.PtyOpen(cols=100, rows=30, cmd="bash"))
    first = await anext(stream)
    assert first.kind == "session" and first.text
    session = first.text
    assert base64.b64decode((await anext(stream)).data_b64) == b"bash\r\n"
    await agent.pty_input("sb-1", session, b"ls\n")
    assert base64.b64decode((await anext(stream)).data_b64) == b"ls\n"  # streamed while the call is open
    await agent.pty_resize("sb-1", session, 120, 40)
    assert pair.fake.pty_sizes[session] == (120, 40)
    with pytest.raises(NotFound):
        await agent.pty_input("sb-1", "no-such-session", b"x")
    await agent.pty_close("sb-1", session)
    rest = await collect(stream)
    assert [(e.kind, e.exit_code) for e in rest] == [("exit", 0)]
    await agent.pty_close("sb-1", session)  # idempotent
    with pytest.raises(NotFound):
        await collect(agent.pty_open("missing", m.PtyOpen()))


async def test_pty_early_close(pair: Pair) -> None:
    await pair.agent.create(spec())
    stream = pair.agent.pty_open("sb-1", m.PtyOpen())
    session = (await anext(stream)).text
    assert session in pair.fake.ptys
    await close_stream(stream)
    await eventually(lambda: session not in pair.fake.ptys)
    await eventually(lambda: pair.fake.sandboxes["sb-1"].in_flight == 0)


# -- snapshots, forks, evidence ------------------------------------------------------------------------------------


async def test_snapshots(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    await agent.write_file("sb-1", "/state", b"v1")
    snap = await agent.snapshot("sb-1", m.SnapshotRequest(snapshot_id="snap-1", labels={"k": "v"}))
    assert (snap.id, snap.sandbox_id, snap.labels, snap.generation) == ("snap-1", "sb-1", {"k": "v"}, "g1")
    assert snap == pair.fake.snapshots["snap-1"]  # every field crosses, the sizes too
    assert snap.shared_bytes > 0 and snap.unique_bytes + snap.shared_bytes == snap.size_bytes
    assert {"unique_bytes", "shared_bytes"} <= snap.model_fields_set  # sent, not defaulted
    stored = await agent.store_snapshot("snap-1")
    assert stored.id == "snap-1" and stored.key
    assert stored.manifest_sha256 is not None and len(stored.manifest_sha256) == 64  # the pin crosses back
    with pytest.raises(NotFound):
        await agent.store_snapshot("missing")
    ref = m.SnapshotRef(id="snap-1", template="base", stored=True, manifest_sha256=stored.manifest_sha256)
    restored = await agent.create(spec("sb-2", from_snapshot=ref))
    assert restored.from_snapshot == "snap-1"
    [sent] = [args[0] for name, args in pair.fake.calls if name == "create" and args[0].sandbox_id == "sb-2"]
    assert sent.from_snapshot == ref  # ... and travels down with the restore
    assert await agent.read_file("sb-2", "/state") == b"v1"
    await agent.snapshot("sb-1", m.SnapshotRequest(snapshot_id="snap-2"))
    assert await agent.prune_snapshots(["snap-2"]) == ["snap-1"]
    assert await agent.prune_snapshots(["snap-2"]) == []
    await agent.delete_snapshot("snap-2", from_store=True)
    await agent.delete_snapshot("snap-2")  # idempotent
    assert ("delete_snapshot", ("snap-2", True)) in pair.fake.calls
    assert (await agent.capacity()).local_snapshots == []


async def test_hibernation_stored_and_woken_as_the_same_sandbox(pair: Pair) -> None:
    agent = pair.agent
    made = await agent.create(spec(metadata={"team": "a"}, env={"A": "1"}, ttl_s=600, egress=["10.9.0.0/16"]))
    await agent.write_file("sb-1", "/state", b"kept")
    with pytest.raises(StateError) as running:
        await agent.store_hibernation("sb-1")  # only a hibernation can be stored
    assert running.value.state == "running" and running.value.required == "hibernated"
    with pytest.raises(NotFound):
        await agent.store_hibernation("missing")
    await agent.hibernate("sb-1")
    stored = await agent.store_hibernation("sb-1")
    assert (stored.id, stored.key, stored.generation) == ("sb-1", "hibernations/sb-1", "g1")
    assert stored.manifest_sha256 is not None and len(stored.manifest_sha256) == 64
    assert {"unique_bytes", "shared_bytes"} <= stored.model_fields_set
    assert await agent.store_hibernation("sb-1") == stored  # idempotent

    wake = m.WakeSpec(
        sandbox_id="sb-1",
        template="base",
        workspace_id="ws-1",
        created_at=made.created_at,
        instance_id=made.instance_id or "",
        metadata={"team": "a"},
        env={"A": "1"},
        ttl_s=600,
        egress=EgressPolicy(allow=["10.9.0.0/16"]),
        manifest_sha256=stored.manifest_sha256,
    )
    again = await agent.wake_stored(wake)  # it never left: the call wakes the one here
    assert again.state == "running" and again.vm_id == made.vm_id
    await agent.hibernate("sb-1")
    await agent.delete("sb-1")  # gone from this host: the stored image is the sandbox now
    with pytest.raises(IntegrityError):  # another manifest than the pinned one: refused, nothing made
        await agent.wake_stored(wake.model_copy(update={"manifest_sha256": "0" * 64}))
    assert "sb-1" not in pair.fake.sandboxes
    woken = await agent.wake_stored(wake)
    assert (woken.id, woken.state, woken.workspace_id, woken.instance_id) == (
        "sb-1",
        "running",
        "ws-1",
        made.instance_id,
    )
    policy = EgressPolicy(allow=["10.9.0.0/16"])  # the create's list of before policies read as this policy
    assert (woken.metadata, woken.env, woken.ttl_s, woken.egress) == ({"team": "a"}, {"A": "1"}, 600, policy)
    assert woken.created_at == made.created_at and woken.vm_id != made.vm_id
    assert await agent.read_file("sb-1", "/state") == b"kept"
    assert ("wake_stored", (wake,)) in pair.fake.calls
    with pytest.raises(NotFound):
        await agent.wake_stored(wake.model_copy(update={"sandbox_id": "sb-none"}))
    with pytest.raises(NotFound):
        await agent.wake_stored(wake.model_copy(update={"sandbox_id": "sb-2", "template": "nope"}))
    assert set(pair.fake.sandboxes) == {"sb-1"}


async def test_evidence(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    await agent.snapshot("sb-1", m.SnapshotRequest(snapshot_id="snap-1"))
    assert await agent.evidence_put("snap-1", "logs/test run.txt", b"failed\n") == 7
    assert await agent.evidence_put("snap-1", "core", bytes(3)) == 3
    listed = await agent.evidence_list("snap-1")
    assert [(e.name, e.size) for e in listed] == [("core", 3), ("logs/test run.txt", 7)]
    assert await agent.evidence_read("snap-1", "logs/test run.txt") == b"failed\n"
    with pytest.raises(NotFound):
        await agent.evidence_read("snap-1", "nope")
    with pytest.raises(NotFound):
        await agent.evidence_list("missing")


async def test_fork_and_tree(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec(env={"A": "1"}))
    await agent.write_file("sb-1", "/f", b"parent")
    child = await agent.fork("sb-1", m.ForkRequest(child_id="child", metadata={"m": "1"}))
    assert (child.id, child.boot_mode, child.metadata) == ("child", "cold", {"m": "1"})
    assert await agent.read_file("child", "/f") == b"parent"
    with pytest.raises(NotFound):
        await agent.fork("missing", m.ForkRequest(child_id="c2"))
    tree = await agent.fork_tree(
        "sb-1", m.TreeRequest(snapshot_id="tree-snap", child_ids=["t1", "t2", "child"], tree_id="tree-1")
    )
    assert tree.snapshot.id == "tree-snap"
    assert [c.id for c in tree.children] == ["t1", "t2"]
    assert tree.children[0].metadata == {"cryobox.tree_id": "tree-1", "cryobox.parent_id": "sb-1"}
    assert [e.child_id for e in tree.errors] == ["child"] and tree.errors[0].error.startswith("wrong_state")
    only_snapshot = await agent.fork_tree("sb-1", m.TreeRequest(snapshot_id="s2", tree_id="tree-2"))
    assert only_snapshot.children == [] and only_snapshot.snapshot.id == "s2"


# -- templates -----------------------------------------------------------------------------------------------------


async def test_templates_build_and_remove(pair: Pair) -> None:
    agent = pair.agent
    events = await collect(agent.build_template(m.TemplateBuild(spec=m.BuildSpec(name="py", cpus=2))))
    assert [e.progress for e in events[:3]] == ["py: resolving packages", "py: building rootfs", "py: baking snapshot"]
    assert events[-1].template is not None and events[-1].template.cpus == 2
    assert {t.name for t in await agent.templates()} == {"base", "py"}
    failed = await collect(agent.build_template(m.TemplateBuild(spec=m.BuildSpec(name="fail-build"))))
    assert failed[-1].error and failed[-1].template is None
    with pytest.raises(InvalidArgument):
        await collect(agent.build_template(m.TemplateBuild(spec=m.BuildSpec(name=""))))
    await agent.remove_template("py")
    with pytest.raises(NotFound):
        await agent.remove_template("py")
    await agent.create(spec())
    with pytest.raises(StateError) as in_use:
        await agent.remove_template("base")
    assert in_use.value.details["by"] == ["sb-1"] and in_use.value.state == "in_use"


# -- isolation -----------------------------------------------------------------------------------------------------


async def test_no_shared_objects(pair: Pair) -> None:
    agent, fake = pair.agent, pair.fake
    request = spec(metadata={"a": "1"})
    created = await agent.create(request)
    request.metadata["b"] = "caller's"  # the caller's input, mutated after the call
    created.metadata["c"] = "caller's"  # the returned value, mutated
    (await agent.list_sandboxes())[0].env["X"] = "y"
    assert fake.sandboxes["sb-1"].metadata == {"a": "1"} and fake.sandboxes["sb-1"].env == {}
    assert (await agent.get("sb-1")).metadata == {"a": "1"}
    net = await agent.inspect_net("sb-1")
    assert net.model_extra is not None
    net.model_extra["egress"].clear()
    net.interfaces[0]["addresses"] = []
    assert (fake.net["sb-1"].model_extra or {})["egress"] == ["*"] and fake.net["sb-1"].interfaces[0]["addresses"]
    tree = await agent.fork_tree("sb-1", m.TreeRequest(snapshot_id="s", child_ids=["c"], tree_id="t"))
    tree.snapshot.labels["x"] = "y"
    tree.children[0].metadata.clear()
    assert fake.snapshots["s"].labels == {}
    assert fake.sandboxes["c"].metadata == {"cryobox.tree_id": "t", "cryobox.parent_id": "sb-1"}
    injected = StateError("nope", state="a", required="b")
    fake.fail_next["get"] = injected
    with pytest.raises(StateError) as err:
        await agent.get("sb-1")
    assert err.value is not injected
    err.value.details["state"] = "changed"
    assert injected.details["state"] == "a"


# -- HTTP only -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
async def test_http_requires_token(http_fake: tuple[str, FakeAgent], headers: dict[str, str]) -> None:
    url, fake = http_fake
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        for response in (
            await client.get("/agent/v1/info"),
            await client.post("/agent/v1/sandboxes", json=spec().model_dump(mode="json")),
            await client.post("/agent/v1/sandboxes", content=b"not json"),
            await client.put("/agent/v1/sandboxes/sb-1/files", params={"path": "/f"}, content=b"data"),
            await client.get("/agent/v1/no-such-route"),
        ):
            assert response.status_code == 401
            assert response.json() == {"error": "missing or invalid agent token", "code": "unauthorized", "details": {}}
        healthz = await client.get("/agent/v1/healthz")
        assert healthz.status_code == 200 and healthz.json() == {"ok": True}
    assert fake.calls == []
    wrong = HttpAgent(url, "wrong")
    try:
        with pytest.raises(CryoboxError) as err:
            await wrong.info()
        assert err.value.code == "unauthorized"
    finally:
        await wrong.close()
    assert fake.calls == []


def test_empty_token_refused() -> None:
    for token in ("", " padded "):
        with pytest.raises(InvalidArgument):
            create_agent_app(FakeAgent(), token)


async def test_http_status_codes(http_fake: tuple[str, FakeAgent]) -> None:
    url, fake = http_fake
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=auth) as client:
        bad = await client.post("/agent/v1/sandboxes", json={"sandbox_id": "x"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"
        garbled = await client.post("/agent/v1/sandboxes", content=b"{", headers={"content-type": "application/json"})
        assert garbled.status_code == 400 and garbled.json()["code"] == "invalid_argument"
        wake = {"sandbox_id": "sb-other", "template": "base", "workspace_id": "w", "created_at": 0, "instance_id": "i"}
        mismatched = await client.post("/agent/v1/hibernations/sb-1/wake", json=wake)
        assert mismatched.status_code == 400 and mismatched.json()["code"] == "invalid_argument"
        assert fake.calls == []
        missing = await client.get("/agent/v1/sandboxes/nope")
        assert missing.status_code == 404 and missing.json()["details"] == {"sandbox_id": "nope"}
        assert (await client.get("/agent/v1/nothing-here")).json()["code"] == "not_found"
        await client.post("/agent/v1/sandboxes", json=spec().model_dump(mode="json"))
        before = await client.post("/agent/v1/sandboxes/sb-1/exec/stream", json={"cmd": "capacity"})
        assert before.status_code == 503 and before.headers["retry-after"] == "7"
        assert before.json()["code"] == "capacity"
        stream = await client.post("/agent/v1/sandboxes/sb-1/exec/stream", json={"cmd": "x"})
        assert stream.headers["content-type"].startswith("application/x-ndjson")
        assert len(stream.text.splitlines()) == 4 and stream.text.startswith('{"event":')
        mid = await client.post("/agent/v1/sandboxes/sb-1/exec/stream", json={"cmd": "fail-mid-stream"})
        assert mid.status_code == 200 and mid.text.splitlines()[-1].startswith('{"error":{')
        fake.fail_next["info"] = RuntimeError("secret detail")
        crash = await client.get("/agent/v1/info")
        assert crash.status_code == 500 and crash.json() == {
            "error": "internal error",
            "code": "internal",
            "details": {},
        }


async def test_http_unexpected_errors(http_fake: tuple[str, FakeAgent]) -> None:
    url, fake = http_fake
    async with HttpAgent(url, TOKEN, name="agent-1") as agent:
        fake.fail_next["capacity"] = KeyError("boom")
        with pytest.raises(CryoboxError) as err:
            await agent.capacity()
        assert type(err.value) is CryoboxError and err.value.code == "internal"
        await agent.create(spec())
        fake.fail_next["build_template"] = ValueError("boom")
        with pytest.raises(CryoboxError) as before:
            await collect(agent.build_template(m.TemplateBuild(spec=m.BuildSpec(name="t"))))
        assert before.value.message == "internal error"


async def test_http_chunked_body_too_large(http_fake: tuple[str, FakeAgent]) -> None:
    url, fake = http_fake
    chunk = bytes(1 << 20)

    async def body() -> AsyncIterator[bytes]:  # no Content-Length: refused while streaming in
        for _ in range(MAX_FILE_BYTES // len(chunk) + 1):
            yield chunk

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        response = await client.put("/agent/v1/sandboxes/sb-1/files", params={"path": "/big"}, content=body())
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"
    assert "write_file" not in fake.call_names()


async def test_http_unreachable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    async with HttpAgent(f"http://127.0.0.1:{port}", TOKEN, name="gone") as agent:
        with pytest.raises(HostUnavailable) as err:
            await agent.info()
        assert err.value.retry_after_s == 2.0 and err.value.details == {"agent": "gone"}
        assert "agent gone is unreachable" in err.value.message
        with pytest.raises(HostUnavailable):
            await collect(agent.exec_stream("sb", m.ExecRequest(cmd="x")))


async def test_http_metrics_override() -> None:
    async def metrics() -> bytes:
        return b"process_series 1\n"

    fake = FakeAgent()
    with served(create_agent_app(fake, TOKEN, metrics_text=metrics)) as url:
        async with HttpAgent(url, TOKEN) as agent:
            assert await agent.metrics_text() == b"process_series 1\n"
    assert "metrics_text" not in fake.call_names()


# -- long-lived processes, watches, file-system calls, ports -------------------------------------------------------


async def test_processes(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    events = await collect(agent.proc_start("sb-1", m.ProcStart(cmd="echo", args=["hi", "there"], tag="t1")))
    assert [e.kind for e in events] == ["start", "stdout", "end"]
    pid = events[0].pid
    assert pid is not None and base64.b64decode(events[1].data_b64) == b"hi there\n"
    assert (events[2].exit_code, events[2].status) == (0, "exit status 0")
    stream = agent.proc_start("sb-1", m.ProcStart(cmd="cat", stdin=True))
    start = await anext(stream)
    await close_stream(stream)  # detach: the process keeps running
    assert start.pid is not None
    cat = m.ProcSelector(pid=start.pid)
    await agent.proc_input("sb-1", m.ProcInput(process=cat, data_b64=base64.b64encode(b"typed").decode()))
    listed = {p.pid: p for p in await agent.proc_list("sb-1")}
    assert listed[pid].running is False and listed[pid].tag == "t1" and listed[start.pid].running is True
    replay = agent.proc_connect("sb-1", cat)
    assert (await anext(replay)).kind == "start"
    assert base64.b64decode((await anext(replay)).data_b64) == b"typed"  # buffered while detached
    await agent.proc_input("sb-1", m.ProcInput(process=cat, eof=True))
    assert [e.kind for e in await collect(replay)] == ["end"]
    with pytest.raises(NotFound):
        await agent.proc_signal("sb-1", m.ProcSignal(process=cat, signal=9))  # it ended
    sleeper = await anext(agent.proc_start("sb-1", m.ProcStart(cmd="sleep", args=["1000"])))
    await agent.proc_signal("sb-1", m.ProcSignal(process=m.ProcSelector(pid=sleeper.pid), signal=9))
    ended = await collect(agent.proc_connect("sb-1", m.ProcSelector(pid=sleeper.pid)))
    assert ended[-1].status == "signal: 9"
    with pytest.raises(NotFound):
        await collect(agent.proc_connect("sb-1", m.ProcSelector(tag="nope")))
    with pytest.raises(NotFound):  # ended
        await agent.proc_input("sb-1", m.ProcInput(process=m.ProcSelector(tag="t1"), data_b64="eA=="))
    with pytest.raises(ValidationError):
        m.ProcSelector(pid=1, tag="both")


async def test_fs_watch_and_ports(pair: Pair) -> None:
    agent = pair.agent
    await agent.create(spec())
    moved = await agent.fs("sb-1", m.FsRequest(op="move", path="/a", destination="/b/c"))
    assert moved.model_dump() == {"path": "/b/c", "name": "c"}
    assert (await agent.fs("sb-1", m.FsRequest(op="list_dir", path="/w", depth=3))).model_dump()["depth"] == 3
    watch = agent.fs_watch("sb-1", m.WatchRequest(path="/w", recursive=True))
    assert (await anext(watch)).kind == "start"
    pair.fake.watch_queues["sb-1"].put_nowait(m.FsEvent(kind="create", name="sub/x.txt"))
    assert await anext(watch) == m.FsEvent(kind="create", name="sub/x.txt")
    await close_stream(watch)
    await eventually(lambda: "sb-1" not in pair.fake.watch_queues)
    target = await agent.port_target("sb-1", 8000)
    if pair.kind == "http":  # the agent's own port route, with its node token
        assert target.url.endswith("/agent/v1/sandboxes/sb-1/ports/8000") and target.headers["Authorization"]
    else:
        assert target == m.PortTarget(url="http://127.0.0.1:9/8000")
    with pytest.raises(InvalidArgument):
        await agent.port_target("sb-1", 0)


async def test_http_template_build_from_a_previous_control_plane(http_fake: tuple[str, FakeAgent]) -> None:
    """A control plane of the previous version sends only the public request: the agent reads it into the spec."""
    url, fake = http_fake
    public = {"name": "py", "base": "base", "packages": ["jq"], "cpu": 2}
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        built = await client.post("/agent/v1/templates", json={"request": public})
        refused = await client.post("/agent/v1/templates", json={"request": {"name": "Not A Name"}})
    assert built.status_code == 200 and '"template":{"name":"py"' in built.text.splitlines()[-1]
    [build] = [args[0] for name, args in fake.calls if name == "build_template"]
    expected = spec_from_request(models.TemplateCreateRequest.model_validate(public))
    assert build.spec.template_spec() == expected and build.spec.cpus == 2
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_argument"


async def test_http_guest_answers_cross_as_the_guest_sent_them(http_fake: tuple[str, FakeAgent]) -> None:
    url, fake = http_fake
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        await client.post("/agent/v1/sandboxes", json=spec().model_dump(mode="json"))
        await client.put("/agent/v1/sandboxes/sb-1/files", params={"path": "/w/f"}, content=b"abc")
        stat = await client.post("/agent/v1/sandboxes/sb-1/files/op", json={"op": "stat", "path": "/w/f"})
        made = await client.post("/agent/v1/sandboxes/sb-1/files/op", json={"op": "mkdir", "path": "/w/d"})
        net = await client.get("/agent/v1/sandboxes/sb-1/net")
    entry = {"name": "f", "is_dir": False, "size": 3, "mode": 0o644, "mtime": 0.0, "path": "/w/f"}
    assert stat.json() == entry and made.json() == {"path": "/w/d"}  # no declared field the guest did not send
    ip = fake.sandboxes["sb-1"].guest_ip
    interfaces = [{"name": "eth0", "mac": "02:00:00:00:00:01", "addresses": [f"{ip}/30"]}]
    assert net.json() == {"sockets": [], "interfaces": interfaces, "ip": ip, "egress": ["*"]}
