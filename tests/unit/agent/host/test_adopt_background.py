"""A restarted agent serves before its adopted guests have answered: :func:`adopt` holds every live sandbox at
once (locked, its guest calls waiting), pings the guests in the background, checks a guest a call waits for ahead
of the queue, and loses only a guest that does not answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.host import adopt as adoption
from cryobox.agent.host.adopt import Survey, adopt
from cryobox.agent.sandbox.records import SandboxRecord, VmRecord
from cryobox.agent.sandbox.sandbox import Sandbox
from cryobox.agent.vm import VmState
from cryobox.agent.vm.readiness import GuestReadiness
from cryobox.errors import GuestError, VmmError


class FakeVm:
    """What adoption touches of a MicroVM; its guest answers a ping when the test says so."""

    def __init__(self, vm_id: str) -> None:
        self.vm_id = vm_id
        self.pid = 4242
        self.state = VmState.RUNNING
        self.volumes: tuple[object, ...] = ()
        self.readiness: GuestReadiness | None = None
        self.pinged = asyncio.Event()
        self.answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reconnected = asyncio.Event()
        self.qmp_answers = asyncio.Event()
        """Cleared: QMP does not answer yet (the test sets it)."""
        self.qmp_answers.set()
        self.qmp_error: Exception | None = None

    async def reconnect(self, timeout: float) -> VmState:
        self.reconnected.set()
        await self.qmp_answers.wait()
        if self.qmp_error is not None:
            raise self.qmp_error
        return self.state

    async def open_guest(self) -> str:
        return f"guest of {self.vm_id}"

    async def wait_guest_ready(self, timeout: float) -> dict[str, Any]:
        self.pinged.set()
        await self.answer
        return {}

    async def connect_guest(self) -> str:
        if self.readiness is not None:
            await self.readiness.wait()
        return f"guest of {self.vm_id}"


class FakeFactory:
    def __init__(self, vms: dict[str, FakeVm]) -> None:
        self.vms = vms
        self.destroyed: list[str] = []
        self.urgent: list[tuple[str, bool]] = []

    def adopt(self, record: VmRecord) -> FakeVm:
        return self.vms[record.vm_id]

    def slot_of(self, vm: FakeVm) -> None:
        return None

    def set_urgent(self, vm: FakeVm, urgent: bool) -> None:
        self.urgent.append((vm.vm_id, urgent))

    async def destroy(self, vm: FakeVm) -> None:
        self.destroyed.append(vm.vm_id)


class FakeService:
    def __init__(self, vms: dict[str, FakeVm]) -> None:
        self.factory = FakeFactory(vms)
        self.held: dict[str, Sandbox] = {}
        self.lost: list[str] = []
        self.persisted: list[tuple[str, SandboxRecord | None]] = []
        self.writing = asyncio.Event()
        """Cleared: a record's write waits for it (the test sets it)."""
        self.writing.set()
        self.background: set[asyncio.Task[None]] = set()

    def clock(self) -> float:
        return 1000.0

    def adopt(self, sandbox: Sandbox) -> None:
        self.held[sandbox.id] = sandbox

    def in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)

    async def persist(self, sandbox: Sandbox, *, read: SandboxRecord | None = None) -> None:
        await self.writing.wait()
        self.persisted.append((sandbox.id, read))

    async def lose(self, sandbox: Sandbox) -> None:
        assert sandbox.lock.locked()  # the caller holds it
        self.held.pop(sandbox.id)
        self.lost.append(sandbox.id)
        await self.factory.destroy(sandbox.vm)  # type: ignore[arg-type]

    async def forget_record(self, sandbox_id: str) -> None:
        raise AssertionError("no record is forgotten here")

    async def close(self) -> None:
        for task in self.background:
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)


def _record(i: int, state: str = "running") -> SandboxRecord:
    vm = VmRecord(
        vm_id=f"vm-{i}",
        pid=4242,
        start_ticks=1,
        root=f"/nonexistent/run/vm-{i}",
        disk="/nonexistent/disk",
        memory_path="/nonexistent/memory",
        memory_share=False,
        write_trackable=True,
        machine={},
    )
    return SandboxRecord(id=f"sb-{i}", template="base", cpus=1, memory_mib=256, state=state, created_at=1.0, vm=vm)


@pytest.fixture
async def twenty() -> AsyncIterator[tuple[FakeService, list[SandboxRecord]]]:
    records = [_record(i) for i in range(20)]  # more than the settling's concurrency: some wait for a place
    service = FakeService({f"vm-{i}": FakeVm(f"vm-{i}") for i in range(20)})
    yield service, records
    await service.close()  # whatever the test left settling is cancelled


async def _adopted(service: FakeService, records: list[SandboxRecord]) -> list[str]:
    return await adopt(service, Survey(live=records), hibernation=None)  # type: ignore[arg-type]


async def test_every_sandbox_is_held_and_locked_before_any_guest_answers(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    service, records = twenty
    assert await asyncio.wait_for(_adopted(service, records), 2) == []
    assert set(service.held) == {r.id for r in records}
    for sandbox in service.held.values():
        assert sandbox.lock.locked() and sandbox.vm.readiness is not None
    await asyncio.sleep(0.05)
    pinged = sum(vm.pinged.is_set() for vm in service.factory.vms.values())
    reconnected = sum(vm.reconnected.is_set() for vm in service.factory.vms.values())
    assert pinged == reconnected == adoption.SETTLE_CONCURRENCY  # the rest wait for a place, QMP included
    assert not service.persisted


async def test_a_call_waiting_for_a_queued_guest_has_it_pinged_at_once_and_goes_on_when_it_answers(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    service, records = twenty
    await _adopted(service, records)
    await asyncio.sleep(0.05)
    last = service.held["sb-19"]
    vm = service.factory.vms["vm-19"]
    assert not vm.pinged.is_set()  # queued behind the first SETTLE_CONCURRENCY
    call = asyncio.create_task(vm.connect_guest())
    await asyncio.wait_for(vm.pinged.wait(), 1)  # ahead of the queue
    assert not call.done()
    assert service.factory.urgent == [("vm-19", True)]  # its QEMU and guest answer ahead of the idle ones
    vm.answer.set_result(None)
    assert await asyncio.wait_for(call, 1) == "guest of vm-19"
    await asyncio.sleep(0.01)
    assert service.factory.urgent == [("vm-19", True), ("vm-19", False)]  # the normal weight again
    assert not last.lock.locked() and vm.readiness is None
    assert service.persisted == [("sb-19", records[19])]  # written again only if it changed (persist decides)


async def test_calls_go_ahead_once_the_guest_answers_and_lifecycle_changes_wait_for_the_rest(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    service, records = twenty
    service.writing.clear()  # the record's write (the last of an adoption) does not finish yet
    await _adopted(service, records)
    sandbox, vm = service.held["sb-0"], service.factory.vms["vm-0"]
    call = asyncio.create_task(vm.connect_guest())
    await asyncio.wait_for(vm.pinged.wait(), 1)
    vm.answer.set_result(None)
    assert await asyncio.wait_for(call, 1) == "guest of vm-0"  # not waiting for the policy or the record
    assert vm.readiness is None
    assert sandbox.lock.locked() and not service.persisted  # a lifecycle change would still wait
    service.writing.set()
    await asyncio.sleep(0.01)
    assert not sandbox.lock.locked() and service.persisted[0] == ("sb-0", records[0])


async def test_a_guest_is_pinged_beside_qmp_and_its_calls_go_as_soon_as_it_answers(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    """QMP's reconnect (connect, greeting, capabilities, status) is the slower half of an adoption among busy
    QEMUs: a running guest is pinged meanwhile, and its calls do not wait for QMP, only lifecycle changes do."""
    service, records = twenty
    for vm in service.factory.vms.values():
        vm.qmp_answers.clear()  # no QEMU's monitor answers yet
    await _adopted(service, records)
    sandbox, vm = service.held["sb-0"], service.factory.vms["vm-0"]
    call = asyncio.create_task(vm.connect_guest())
    await asyncio.wait_for(vm.pinged.wait(), 1)
    assert vm.reconnected.is_set() and not call.done()
    vm.answer.set_result(None)
    assert await asyncio.wait_for(call, 1) == "guest of vm-0"  # QMP still silent
    assert sandbox.lock.locked() and not service.persisted
    vm.qmp_answers.set()
    await asyncio.sleep(0.01)
    assert not sandbox.lock.locked() and service.persisted == [("sb-0", records[0])]


async def test_a_lifecycle_change_waiting_for_a_queued_sandbox_has_its_adoption_go_ahead(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    service, records = twenty
    await _adopted(service, records)
    await asyncio.sleep(0.05)
    sandbox, vm = service.held["sb-19"], service.factory.vms["vm-19"]
    assert not vm.reconnected.is_set()  # queued

    async def change() -> None:  # e.g. a pause: takes the lock, makes no guest call
        async with sandbox.lock:
            pass

    changing = asyncio.create_task(change())
    await asyncio.wait_for(vm.reconnected.wait(), 1)  # ahead of the queue
    await asyncio.wait_for(vm.pinged.wait(), 1)
    assert not changing.done()
    vm.answer.set_result(None)
    await asyncio.wait_for(changing, 1)
    queued = [v for v in service.factory.vms.values() if not v.reconnected.is_set()]
    assert len(queued) == 20 - adoption.SETTLE_CONCURRENCY - 1  # the others still wait for a place


async def test_a_vm_whose_qmp_fails_is_lost_and_its_waiting_call_fails(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    service, records = twenty
    vm = service.factory.vms["vm-0"]
    vm.qmp_error = VmmError("QMP of VM vm-0 did not answer")
    await _adopted(service, records)
    call = asyncio.create_task(vm.connect_guest())
    with pytest.raises(GuestError, match="did not come back"):
        await asyncio.wait_for(call, 1)
    await asyncio.sleep(0.01)
    assert service.lost == ["sb-0"] and service.factory.destroyed == ["vm-0"]  # its QEMU killed


async def test_a_guest_that_does_not_answer_is_lost_and_its_waiting_call_fails(
    twenty: tuple[FakeService, list[SandboxRecord]],
) -> None:
    service, records = twenty
    await _adopted(service, records)
    vm = service.factory.vms["vm-0"]
    call = asyncio.create_task(vm.connect_guest())
    await asyncio.wait_for(vm.pinged.wait(), 1)
    vm.answer.set_exception(GuestError("guest agent did not answer within 15s"))
    with pytest.raises(GuestError, match="did not come back"):
        await asyncio.wait_for(call, 1)
    await asyncio.sleep(0.01)
    assert service.lost == ["sb-0"] and service.factory.destroyed == ["vm-0"]
    assert "sb-0" not in service.held


async def test_a_paused_sandbox_needs_no_ping_and_a_stop_during_adoption_unlocks_everything(tmp_path: Path) -> None:
    records = [_record(0, state="paused"), _record(1)]
    vms = {"vm-0": FakeVm("vm-0"), "vm-1": FakeVm("vm-1")}
    vms["vm-0"].state = VmState.PAUSED
    service = FakeService(vms)
    await _adopted(service, records)
    await asyncio.sleep(0.01)
    paused = service.held["sb-0"]
    assert not paused.lock.locked() and paused.vm.readiness is None and not vms["vm-0"].pinged.is_set()
    running = service.held["sb-1"]
    waiting = asyncio.create_task(running.vm.connect_guest())
    await asyncio.sleep(0.01)
    await service.close()  # the agent stops before the guest answered
    assert not running.lock.locked()
    with pytest.raises(GuestError):
        await waiting
    assert service.lost == []  # a stop loses nothing
