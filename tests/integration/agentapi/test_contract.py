"""The agent interface's contract, run against both transports with real VMs.

One suite, two fixtures' worth of transports: the in-process agent (what ``cryobox serve`` uses) and a
``cryobox agent`` process reached over HTTP with the node token (what ``cryobox control`` uses). Every test
asserts the same behaviour of both, so the seam cannot drift between them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.host.startup import HostConfig
from cryobox.agent.sandbox.admission import AdmissionConfig
from cryobox.agent.templates.bake import Template
from cryobox.agentapi import Agent, HttpAgent, InProcessAgent
from cryobox.agentapi import models as am
from cryobox.agentapi import models_volumes as am_volumes
from cryobox.bench.server import ServeProcess, free_port
from cryobox.compose.parts import AgentOptions, boot_agent
from cryobox.config import Paths
from cryobox.errors import InvalidArgument, NotFound, StateError
from cryobox.image.specs import by_name

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOKEN = "node-" + secrets.token_hex(12)
DATA_DIRS: dict[str, Path] = {}
"""Agent name → its data dir (the race tests look at what the agent left on disk)."""


@contextlib.contextmanager
def agent_process(data_dir: Path, cache_dir: Path) -> Iterator[str]:
    """``cryobox agent`` on a free loopback port (its control plane is absent: heartbeats just fail)."""
    port = free_port()
    log = data_dir.parent / f"{data_dir.name}.log"
    argv = [sys.executable, "-m", "cryobox.cli.main", "agent", "--listen", f"127.0.0.1:{port}"]
    argv += ["--control", "http://127.0.0.1:9", "--data-dir", str(data_dir), "--cache-dir", str(cache_dir)]
    argv += ["--templates", "base", "--prespawn", "1", "--net-pool", "2", "--name", "contract-http"]
    env = {**os.environ, "CRYOBOX_NODE_TOKEN": TOKEN, "CRYOBOX_ON_STOP": "kill"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"cryobox agent exited: {log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/agent/v1/healthz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "cryobox agent did not come up"
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        leaked = find_own_qemus(data_dir / "vol" / "run")
        ServeProcess(data_dir, cache_dir=cache_dir).cleanup()
        assert not leaked, f"cryobox agent left QEMU processes: {leaked}"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["inprocess", "http"])
async def agent(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cache_dir: Path,
    templates: dict[str, Template],
) -> AsyncIterator[Agent]:
    data_dir = tmp_path_factory.mktemp(f"contract-{request.param}")
    DATA_DIRS["contract-http" if request.param == "http" else "contract-inproc"] = data_dir
    if request.param == "http":
        with agent_process(data_dir, cache_dir) as url:
            client = HttpAgent(url, TOKEN, name="contract-http")
            try:
                yield client
            finally:
                await client.close()
        return
    spec = by_name("base")
    assert spec is not None
    config = HostConfig(paths=Paths(data_dir, cache_dir), prespawn=1, net_pool=2, templates=(spec,))
    host, impl = await boot_agent(config, AdmissionConfig(), AgentOptions(name="contract-inproc"), print)
    try:
        yield InProcessAgent(impl)
    finally:
        await host.close()
        assert find_own_qemus(data_dir / "vol" / "run") == []


def spec(**kw: object) -> am.CreateSpec:
    values: dict[str, object] = {"sandbox_id": f"sb-{secrets.token_hex(6)}", "template": "base", "workspace_id": "ws"}
    values.update(kw)
    return am.CreateSpec.model_validate(values)


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox(agent: Agent) -> AsyncIterator[am.SandboxInfo]:
    info = await agent.create(spec(metadata={"k": "v"}))
    try:
        yield info
    finally:
        await agent.delete(info.id)


async def sh(agent: Agent, sandbox_id: str, cmd: str) -> str:
    result = await agent.exec(sandbox_id, am.ExecRequest(cmd=cmd))
    assert result.exit_code == 0, result
    return result.stdout


async def test_host_description(agent: Agent) -> None:
    info = await agent.info()
    assert info.name.startswith("contract-") and len(info.boot_id) == 32
    assert info.accelerator in ("kvm", "tcg")
    capacity = await agent.capacity()
    assert capacity.memory_total_mib > 0 and capacity.vcpus_total > 0
    assert "base" in capacity.templates_ready
    assert [t.name for t in await agent.templates()] == ["base"]
    assert b"store_gets_total" in await agent.metrics_text()


async def test_create_exec_list_delete(agent: Agent) -> None:
    created = await agent.create(spec(metadata={"job": "7"}, env={"GREETING": "hi"}))
    try:
        assert created.state == "running" and created.boot_mode == "restore" and created.guest_ip
        assert created.metadata == {"job": "7"} and created.workspace_id == "ws"
        assert await sh(agent, created.id, "echo $GREETING") == "hi\n"
        assert created.id in {s.id for s in await agent.list_sandboxes()}
        events = [e async for e in agent.exec_stream(created.id, am.ExecRequest(cmd="echo a; echo b >&2; exit 3"))]
        assert "".join(e.text for e in events if e.kind == "stdout") == "a\n"
        assert "".join(e.text for e in events if e.kind == "stderr") == "b\n"
        assert events[-1].kind == "exit" and events[-1].result is not None and events[-1].result.exit_code == 3
        with pytest.raises(StateError):  # the id is taken
            await agent.create(spec(sandbox_id=created.id))
    finally:
        await agent.delete(created.id)
    with pytest.raises(NotFound):
        await agent.get(created.id)
    await agent.delete(created.id)  # idempotent
    with pytest.raises(NotFound):
        await agent.exec(created.id, am.ExecRequest(cmd="true"))
    with pytest.raises(NotFound):
        await agent.create(spec(template="no-such-template"))


async def test_files(agent: Agent, sandbox: am.SandboxInfo) -> None:
    blob = os.urandom(1 << 20)
    written = await agent.write_file(sandbox.id, "/work/dir/blob.bin", blob)
    assert written.bytes == len(blob)
    assert await agent.read_file(sandbox.id, "/work/dir/blob.bin") == blob
    stat = await agent.file_op(sandbox.id, "stat", "/work/dir/blob.bin")
    assert stat.size == len(blob)
    listing = await agent.file_op(sandbox.id, "list_dir", "/work/dir")
    entries = listing.entries
    assert isinstance(entries, list) and [e.name for e in entries] == ["blob.bin"]
    await agent.file_op(sandbox.id, "delete", "/work/dir/blob.bin")
    with pytest.raises(NotFound):
        await agent.read_file(sandbox.id, "/work/dir/blob.bin")
    with pytest.raises(InvalidArgument):
        await agent.file_op(sandbox.id, "chmod", "/work")
    net = await agent.inspect_net(sandbox.id)
    assert {"sockets", "interfaces"} & net.model_fields_set


async def test_lifecycle_states(agent: Agent, sandbox: am.SandboxInfo) -> None:
    assert (await agent.pause(sandbox.id)).state == "paused"
    with pytest.raises(StateError) as refused:
        await agent.exec(sandbox.id, am.ExecRequest(cmd="true"))
    assert refused.value.state == "paused"
    assert (await agent.resume(sandbox.id)).state == "running"
    await sh(agent, sandbox.id, "echo keep > /root/mark")
    assert (await agent.hibernate(sandbox.id)).state == "hibernated"
    assert await sh(agent, sandbox.id, "cat /root/mark") == "keep\n"  # any request wakes it
    assert (await agent.get(sandbox.id)).state == "running"


async def _settled(agent: Agent, run_dir: Path) -> tuple[int, int]:
    """Wait until every QEMU of the agent is a sandbox's or a pooled one (a leaked VM never settles)."""
    deadline = time.monotonic() + 60
    while True:
        capacity = await agent.capacity()
        expected = capacity.sandboxes_running + capacity.prespawned
        found = len(find_own_qemus(run_dir))
        if found == expected or time.monotonic() > deadline:
            return found, expected
        await asyncio.sleep(0.5)


async def test_hibernated_sandboxes_wake_for_anything_and_races_leak_nothing(agent: Agent) -> None:
    data_dir = DATA_DIRS[(await agent.info()).name]
    sandbox = (await agent.create(spec())).id
    try:
        await agent.hibernate(sandbox)
        assert (await agent.write_file(sandbox, "/root/w", b"woken")).bytes == 5  # wakes it (was 409)
        await agent.hibernate(sandbox)
        events = [e async for e in agent.exec_stream(sandbox, am.ExecRequest(cmd="cat /root/w"))]  # wakes it
        assert "".join(e.text for e in events if e.kind == "stdout") == "woken"
        snap = await agent.snapshot(sandbox, am.SnapshotRequest(snapshot_id=f"snap-{secrets.token_hex(6)}"))
        assert snap.size_bytes > 0  # a woken sandbox snapshots (was 500: no mapping of its memory)
        await agent.delete_snapshot(snap.id)
        await agent.hibernate(sandbox)
        # the reaper deleting a sandbox mid-wake: delete waits for the wake, then kills what it made
        waking = asyncio.ensure_future(agent.wake(sandbox))
        await asyncio.sleep(0.05)
        await agent.delete(sandbox)
        with contextlib.suppress(NotFound, StateError):
            await waking
        with pytest.raises(NotFound):
            await agent.get(sandbox)
        found, expected = await _settled(agent, data_dir / "vol" / "run")
        assert found == expected, f"{found} QEMUs for {expected} sandboxes and pooled VMs: a wake leaked one"
        # delete racing hibernate leaves no image and no record
        other = (await agent.create(spec())).id
        hibernating = asyncio.ensure_future(agent.hibernate(other))
        await asyncio.sleep(0.05)
        await agent.delete(other)
        with contextlib.suppress(NotFound, StateError):
            await hibernating
        for gone in (sandbox, other):
            assert not [p for p in (data_dir / "vol" / "hibernate").iterdir() if p.name.startswith(gone)]
            assert not (data_dir / "vol" / "sandboxes" / f"{gone}.json").exists()
    finally:
        await agent.delete(sandbox)


async def test_idle_tracking(agent: Agent, sandbox: am.SandboxInfo) -> None:
    """TTL is idle time: a request in flight keeps the sandbox alive however long it runs."""
    patched = await agent.set_lifecycle(sandbox.id, am.LifecyclePatch(set_ttl=True, ttl_s=1))
    assert patched.ttl_s == 1 and not patched.expired
    stream = agent.exec_stream(sandbox.id, am.ExecRequest(cmd="sleep 2.5; echo done"))
    first = asyncio.ensure_future(anext(aiter(stream)))
    await asyncio.sleep(1.8)
    busy = await agent.get(sandbox.id)
    assert busy.in_flight == 1 and not busy.expired  # 1.8 s into a 1 s TTL, but busy
    assert (await first).text == "done\n"
    async for _ in stream:
        pass
    assert not (await agent.get(sandbox.id)).expired  # the idle clock restarted when the request ended
    await asyncio.sleep(1.3)
    assert (await agent.get(sandbox.id)).expired
    kept = await agent.set_lifecycle(sandbox.id, am.LifecyclePatch(persistent=True))
    assert kept.persistent and not kept.expired and kept.expires_at is None


async def test_terminal(agent: Agent, sandbox: am.SandboxInfo) -> None:
    await agent.set_lifecycle(sandbox.id, am.LifecyclePatch(set_ttl=True, ttl_s=1))
    stream = agent.pty_open(sandbox.id, am.PtyOpen(cols=100, rows=30, cmd="/bin/sh"))
    try:
        session = await anext(aiter(stream))
        assert session.kind == "session" and session.text
        await asyncio.sleep(1.5)  # an open terminal keeps its sandbox alive, typed into or not
        idle = await agent.get(sandbox.id)
        assert idle.in_flight >= 1 and not idle.expired
        await agent.pty_resize(sandbox.id, session.text, 120, 40)
        await agent.pty_input(sandbox.id, session.text, b"stty size; echo con$((1+1))tract\n")
        seen = b""
        while b"con2tract" not in seen or b"40 120" not in seen:
            event = await asyncio.wait_for(anext(aiter(stream)), 30)
            if event.kind == "output":
                seen += base64.b64decode(event.data_b64)
        await agent.pty_input(sandbox.id, session.text, b"exit 5\n")
        last = None
        async for event in stream:
            last = event
        assert last is not None and last.kind == "exit" and last.exit_code == 5
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_snapshots_and_trees(agent: Agent, sandbox: am.SandboxInfo) -> None:
    await sh(agent, sandbox.id, "echo before > /root/state; nohup sleep 1000 >/dev/null 2>&1 &")
    snap_id = f"snap-{secrets.token_hex(6)}"
    snap = await agent.snapshot(sandbox.id, am.SnapshotRequest(snapshot_id=snap_id, labels={"step": "1"}))
    assert snap.id == snap_id and snap.template == "base" and snap.generation
    assert snap.labels == {"step": "1"} and snap.sandbox_id == sandbox.id and snap.size_bytes > 0
    assert snap_id in (await agent.capacity()).local_snapshots
    assert "console.log" in {e.name for e in await agent.evidence_list(snap_id)}
    assert await agent.evidence_put(snap_id, "note.txt", b"seen") == 4
    assert await agent.evidence_read(snap_id, "note.txt") == b"seen"
    stored = await agent.store_snapshot(snap_id)
    assert stored.key == f"snapshots/{snap_id}" and (await agent.store_snapshot(snap_id)) == stored

    restored = await agent.create(spec(from_snapshot=am.SnapshotRef(id=snap_id, template="base")))
    tree_snap = f"snap-{secrets.token_hex(6)}"
    children = [f"sb-{secrets.token_hex(6)}" for _ in range(2)]
    try:
        assert restored.from_snapshot == snap_id
        assert await sh(agent, restored.id, "cat /root/state; pgrep -c -x sleep") == "before\n1\n"
        tree = await agent.fork_tree(
            sandbox.id, am.TreeRequest(snapshot_id=tree_snap, child_ids=children, metadata={"t": "1"}, tree_id="tree-x")
        )
        assert sorted(c.id for c in tree.children) == sorted(children) and tree.errors == []
        assert tree.snapshot.id == tree_snap
        assert all(c.metadata["cryobox.tree_id"] == "tree-x" for c in tree.children)
        ids = {await sh(agent, c, "cat /run/cryobox/instance-id") for c in children}
        assert len(ids) == 2  # each child is its own machine
    finally:
        for sandbox_id in [restored.id, *children]:
            await agent.delete(sandbox_id)
    await agent.delete_snapshot(snap_id, from_store=True)
    assert snap_id not in (await agent.capacity()).local_snapshots
    with pytest.raises(NotFound):  # neither here nor in the store any more
        await agent.create(spec(from_snapshot=am.SnapshotRef(id=snap_id, template="base", stored=True)))
    assert await agent.prune_snapshots([]) == [tree_snap]
    assert (await agent.capacity()).local_snapshots == []


async def test_volume_images(agent: Agent) -> None:
    """Both transports make, read, grow and remove a volume's image; errors cross as the same wire codes."""
    volume_id = f"vol-{secrets.token_hex(6)}"
    spec = am_volumes.VolumeSpec(volume_id=volume_id, size_bytes=32 << 20, label="fcvol-contract")
    made = await agent.create_volume(spec)
    try:
        assert made.volume_id == volume_id and made.size_bytes == 32 << 20 and made.allocated_bytes > 0
        assert await agent.create_volume(spec) == made  # a retried create
        assert volume_id in [v.volume_id for v in await agent.list_volumes()]
        grown = await agent.resize_volume(volume_id, am_volumes.VolumeResize(size_bytes=64 << 20))
        assert grown.size_bytes == 64 << 20 and (await agent.volume_info(volume_id)).size_bytes == 64 << 20
        with pytest.raises(InvalidArgument):
            await agent.resize_volume(volume_id, am_volumes.VolumeResize(size_bytes=32 << 20))
    finally:
        await agent.delete_volume(volume_id)
    await agent.delete_volume(volume_id)  # idempotent
    with pytest.raises(NotFound):
        await agent.volume_info(volume_id)


async def test_snapshots_and_trees_with_volumes(agent: Agent) -> None:
    """Both transports carry a tree child's volumes (a clone of the parent's, ``clone_of``) and the 409 of a volume
    in use (``volume_busy``, with its path)."""
    source, clone = f"vol-{secrets.token_hex(6)}", f"vol-{secrets.token_hex(6)}"
    await agent.create_volume(am_volumes.VolumeSpec(volume_id=source, size_bytes=32 << 20, label="fcvol-contract"))
    parent = await agent.create(spec(volumes=[am_volumes.VolumeMount(volume_id=source, path="/data")]))
    child = f"sb-{secrets.token_hex(6)}"
    tree_snap = f"snap-{secrets.token_hex(6)}"
    try:
        await sh(agent, parent.id, "echo parent > /data/f && sync")
        await sh(agent, parent.id, "nohup sh -c 'cd /data && exec sleep 600' >/dev/null 2>&1 & echo $! > /tmp/h")
        await sh(agent, parent.id, "sleep 0.5")
        with pytest.raises(StateError) as busy:
            await agent.snapshot(parent.id, am.SnapshotRequest(snapshot_id=f"snap-{secrets.token_hex(6)}"))
        assert busy.value.state == "volume_busy" and busy.value.details["path"] == "/data"
        await sh(agent, parent.id, "kill $(cat /tmp/h); while kill -0 $(cat /tmp/h) 2>/dev/null; do sleep 0.1; done")
        request = am.TreeRequest(
            snapshot_id=tree_snap,
            child_ids=[child],
            tree_id="tree-v",
            volumes={child: [am_volumes.ChildVolume(volume_id=clone, path="/data", clone_of=source)]},
        )
        tree = await agent.fork_tree(parent.id, request)
        assert tree.errors == [] and [c.id for c in tree.children] == [child]
        assert await sh(agent, child, "cat /data/f; echo child > /data/f; sync") == "parent\n"
        assert await sh(agent, parent.id, "cat /data/f") == "parent\n"  # the clone is the child's own
        assert {source, clone} <= {v.volume_id for v in await agent.list_volumes()}
    finally:
        for sandbox_id in (parent.id, child):
            await agent.delete(sandbox_id)
        await agent.delete_snapshot(tree_snap)
        for volume_id in (source, clone):
            await agent.delete_volume(volume_id)
