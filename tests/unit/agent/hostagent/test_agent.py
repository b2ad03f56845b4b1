"""HostAgent over the fake VM layer (``tests/support/fake_host.py``), called through the in-process transport as the
control plane calls it: creates wait in admission (and a full queue refuses them with nothing made), capacity
counts what the host holds, a lifecycle change is durable, a request in flight keeps its sandbox alive, delete is
idempotent, a failing metrics source never fails a scrape, and the host's accelerator is what it reports."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cryobox.agentapi import Agent, InProcessAgent
from cryobox.agentapi import models as am
from cryobox.errors import HostUnavailable, InvalidArgument, NotFound
from tests.support.fake_host import AgentRig, make_agent
from tests.support.fake_vm import FakeGuest


def spec(sandbox_id: str, **kw: object) -> am.CreateSpec:
    return am.CreateSpec.model_validate({"sandbox_id": sandbox_id, "template": "base", "workspace_id": "ws", **kw})


@pytest.fixture
def rigged(tmp_path: Path) -> AgentRig:
    return make_agent(tmp_path)


@pytest.fixture
def agent(rigged: AgentRig) -> Agent:
    return InProcessAgent(rigged.agent)


async def test_info_reports_the_hosts_accelerator_and_its_boundary(agent: Agent) -> None:
    info = await agent.info()
    assert (info.name, info.accelerator, info.isolation) == ("host-a", "tcg", "tcg")
    assert info.jail["enabled"] is False and "TCG" in str(info.jail["boundary"])


async def test_create_get_list_and_an_idempotent_delete(agent: Agent, rigged: AgentRig) -> None:
    made = await agent.create(spec("sb-1", metadata={"k": "v"}, ttl_s=60))
    assert (made.id, made.state, made.template, made.memory_mib, made.cpus) == ("sb-1", "running", "base", 512, 2)
    assert made.metadata == {"k": "v"} and made.ttl_s == 60 and made.boot_mode == "restore"
    assert (await agent.get("sb-1")) == made
    assert [s.id for s in await agent.list_sandboxes()] == ["sb-1"]
    await agent.delete("sb-1")
    await agent.delete("sb-1")  # idempotent: an unknown id is not an error
    await agent.delete("sb-never")
    with pytest.raises(NotFound):
        await agent.get("sb-1")
    assert rigged.rig.recorded() == {} and rigged.rig.factory.destroyed == [rigged.rig.factory.made[0].vm_id]


async def test_a_create_waits_for_admission_and_a_full_queue_refuses_it_with_nothing_made(tmp_path: Path) -> None:
    rigged = make_agent(tmp_path, max_concurrent=1, queue_length=0)
    agent: Agent = InProcessAgent(rigged.agent)
    async with rigged.agent.admission.slot():  # every restore slot taken, no room to queue
        with pytest.raises(HostUnavailable, match="queue"):
            await agent.create(spec("sb-1"))
    assert rigged.rig.factory.made == [] and dict(rigged.rig.service.sandboxes) == {}
    assert (await agent.create(spec("sb-1"))).state == "running"  # the slot is free again


async def test_a_queued_create_runs_once_a_slot_frees(tmp_path: Path) -> None:
    rigged = make_agent(tmp_path, max_concurrent=1, queue_length=1)
    agent: Agent = InProcessAgent(rigged.agent)
    release = asyncio.Event()

    async def hold() -> None:
        async with rigged.agent.admission.slot():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    create = asyncio.create_task(agent.create(spec("sb-1")))
    for _ in range(100):
        await asyncio.sleep(0)
    assert not create.done() and (await agent.capacity()).admission_queue_depth == 1
    assert rigged.rig.factory.made == []  # nothing restored while it waits
    release.set()
    assert (await create).state == "running"
    await holder


async def test_capacity_counts_what_the_host_holds(agent: Agent) -> None:
    await agent.create(spec("sb-1"))
    await agent.create(spec("sb-2"))
    await agent.hibernate("sb-2")  # a hibernated sandbox holds no memory or vCPUs
    cap = await agent.capacity()
    assert (cap.sandboxes, cap.sandboxes_running) == (2, 1)
    assert (cap.memory_committed_mib, cap.vcpus_committed) == (512, 2)
    assert (cap.memory_total_mib, cap.vcpus_total, cap.max_sandboxes) == (4096, 8, 16)
    assert cap.templates_ready == {"base": "g1"} and cap.restores_in_flight == 0


async def test_a_lifecycle_change_is_durable_through_the_interface(agent: Agent, rigged: AgentRig) -> None:
    await agent.create(spec("sb-1", ttl_s=60))
    rigged.rig.clock.now = 1234.0
    info = await agent.set_lifecycle("sb-1", am.LifecyclePatch(set_ttl=True, ttl_s=None, persistent=True))
    assert (info.ttl_s, info.persistent, info.last_active, info.expires_at) == (None, True, 1234.0, None)
    [record] = rigged.rig.records.load_all()
    assert (record.ttl_s, record.persistent) == (None, True)
    info = await agent.set_lifecycle("sb-1", am.LifecyclePatch(persistent=False))  # the TTL left as it is
    assert (info.ttl_s, info.persistent) == (None, False)
    rigged.rig.clock.now = 2000.0
    assert (await agent.touch("sb-1")).last_active == 2000.0


async def test_a_request_in_flight_keeps_the_sandbox_alive(agent: Agent, rigged: AgentRig) -> None:
    await agent.create(spec("sb-1", ttl_s=10))
    rigged.rig.clock.now = 5000.0  # long past its TTL: idle
    assert (await agent.get("sb-1")).expired is True
    started = asyncio.Event()
    proceed = asyncio.Event()
    service = rigged.rig.service

    async def slow_exec() -> am.ExecResult:
        async with service.busy("sb-1"):
            started.set()
            await proceed.wait()
        return await agent.exec("sb-1", am.ExecRequest(cmd="true"))

    task = asyncio.create_task(slow_exec())
    await started.wait()
    busy = await agent.get("sb-1")
    assert (busy.in_flight, busy.expired, busy.idle_s) == (1, False, 0.0)
    proceed.set()
    assert (await task).exit_code == 0
    done = await agent.get("sb-1")
    assert (done.in_flight, done.last_active, done.expired) == (0, 5000.0, False)


async def test_an_unknown_file_op_is_refused_before_the_guest(agent: Agent, rigged: AgentRig) -> None:
    await agent.create(spec("sb-1"))
    guest = rigged.rig.vm("sb-1").fake_guest
    calls = len(guest.calls)
    with pytest.raises(InvalidArgument, match="unknown file operation"):
        await rigged.agent.file_op("sb-1", "chmod", "/x")
    assert len(guest.calls) == calls


async def test_a_failing_metrics_source_never_fails_a_scrape(tmp_path: Path) -> None:
    async def broken() -> str:
        raise RuntimeError("source down")

    async def fine() -> str:
        return "cryobox_admission_queue_depth 0.0\n"

    sources: list[Callable[[], Awaitable[str]]] = [broken, fine]
    agent = InProcessAgent(make_agent(tmp_path, metrics_sources=sources).agent)
    text = (await agent.metrics_text()).decode()
    assert "cryobox_faults_total 0.0" in text and "cryobox_admission_queue_depth 0.0" in text


async def test_a_sigkill_answers_once_the_guest_lists_the_process_ended(
    agent: Agent, rigged: AgentRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list right after a kill never shows the process running (E2B's SDK lists right after ``kill()``)."""
    await agent.create(spec("sb-1"))
    lists: list[float] = []
    answer = FakeGuest.call

    async def call(guest: FakeGuest, op: str, args: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        if op == "proc_list":  # the guest's reaper ends it on the third look
            lists.append(time.monotonic())
            running = len(lists) < 3
            return {"processes": [{"pid": 42, "cmd": "sleep", "running": running}, {"pid": 7, "cmd": "x"}]}
        return await answer(guest, op, args, **kw)

    monkeypatch.setattr(FakeGuest, "call", call)
    await agent.proc_signal("sb-1", am.ProcSignal(process=am.ProcSelector(pid=42), signal=signal.SIGKILL))
    assert len(lists) == 3
    await agent.proc_signal("sb-1", am.ProcSignal(process=am.ProcSelector(pid=42), signal=signal.SIGTERM))
    assert len(lists) == 3  # only a SIGKILL waits: the process may handle any other signal
