"""Re-adopting what an earlier agent on this data dir left running (see :mod:`..sandbox.records`).

At start, before anything is reclaimed, :func:`survey` sorts the records: a running/paused sandbox whose QEMU
still runs (same pid *and* start time, pidfile in our run directory) is *live*; a hibernated one whose image is
complete is *hibernated*; anything else is *lost* (its QEMU died with or after the agent; the control plane
marks it ``lost`` when the agent's report omits it). Reclaim then spares exactly the live VMs' processes, run
directories, network slots and hot memory. :func:`adopt` rebuilds each live VM's :class:`~.sandbox.Sandbox` from
the record (:mod:`..sandbox.mapping`), holding its QEMU by pid, and hands it to the service
(``SandboxService.adopt``) at once; each is finished in the background while the agent serves (QMP reconnected
and its run state mended, its guest's ping, its slot rules and policy, its record); a VM whose QMP or guest does
not answer is killed and counted lost. Reconnecting QMP before serving took 0.13-0.42 s of a restart with 50 VMs
under TCG (every QEMU scheduled to answer); now a request waits for its own sandbox's only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import VmmError
from ..memory.hot import HotImages
from ..net.netlink import load_slot_rules, slot_rules_digest
from ..net.slots import Slot, SlotPlan
from ..sandbox.fidelity import rejoin
from ..sandbox.mapping import adopted_sandbox
from ..sandbox.records import SandboxRecord, SandboxRecords
from ..sandbox.sandbox import Sandbox, SandboxState
from ..sandbox.service import SandboxService
from ..snapshot.store import SnapshotStore
from ..vm import VmState
from ..vm.readiness import GuestReadiness, WantedLock, wait_turn

log = logging.getLogger(__name__)
ADOPT_GUEST_TIMEOUT_S = 15.0
ADOPT_QMP_TIMEOUT_S = 5.0
SETTLE_CONCURRENCY = 4
"""Adoptions finished at once in the background while the agent serves (a sandbox a request waits for goes ahead):
each ping wakes a guest, and under TCG every guest woken at once takes CPU from the one a request waits for."""


@dataclass
class Survey:
    live: list[SandboxRecord] = field(default_factory=list)
    hibernated: list[SandboxRecord] = field(default_factory=list)
    lost: list[SandboxRecord] = field(default_factory=list)

    def keep_vms(self) -> dict[str, int]:
        """Run directory name → pid of every live VM (what reclaim must spare)."""
        return {Path(r.vm.root).name: r.vm.pid for r in self.live if r.vm is not None}

    def slot_cidr(self) -> str | None:
        return next((r.vm.slot_cidr for r in self.live if r.vm is not None and r.vm.slot_cidr), None)

    def slots(self, plan: SlotPlan) -> list[Slot]:
        return [plan.slot(r.vm.slot_index) for r in self.live if r.vm is not None and r.vm.slot_index is not None]

    def hot_keys(self, hot: HotImages) -> set[str]:
        keys = {hot.key_of(Path(r.vm.memory_path)) for r in self.live if r.vm is not None}
        return {k for k in keys if k is not None}

    def hibernation_dirs(self) -> set[str]:
        return {Path(r.hibernation).name for r in self.hibernated if r.hibernation}


def survey(records: SandboxRecords, run_dir: Path) -> Survey:
    found = Survey()
    for record in records.load_all():
        vm = record.vm
        if record.state == SandboxState.HIBERNATED.value:
            complete = record.hibernation is not None and (Path(record.hibernation) / "manifest.json").is_file()
            (found.hibernated if complete else found.lost).append(record)
        elif vm is not None and Path(vm.root).parent == run_dir and vm.alive():
            found.live.append(record)
        else:
            found.lost.append(record)
    return found


def _hold(service: SandboxService, record: SandboxRecord) -> Sandbox:
    """The sandbox of a live record, handed to the service at once: its VM held by pid (no connection yet), its
    lock taken (whoever waits for it has its adoption go ahead of the queue: :class:`~..vm.readiness.WantedLock`)
    and its guest calls waiting (:class:`~..vm.readiness.GuestReadiness`).

    :raises VmmError: its QEMU is gone.
    """
    assert record.vm is not None
    vm = service.factory.adopt(record.vm)
    readiness = vm.readiness = GuestReadiness()
    sandbox = adopted_sandbox(
        record, vm, service.clock(), state=SandboxState(record.state), slot=service.factory.slot_of(vm)
    )
    sandbox.lock = WantedLock(readiness.wanted)
    return sandbox


async def _settle(service: SandboxService, sandbox: Sandbox, record: SandboxRecord) -> None:
    """What an adoption finishes while the agent serves: QMP reconnected and the VM's run state mended where an
    operation the dead agent never finished left it, the guest answers (its calls go ahead from here), the slot
    has today's rules and the sandbox's policy is served again, the record is written again if it changed.

    Guest calls do not wait for the policy: until it is served again the slot's redirect finds no proxy and its
    DNS no server, so the guest's egress fails closed meanwhile, as it did while no agent ran (~20-60 ms of a
    first exec after a restart under load)."""
    assert record.vm is not None
    vm = sandbox.vm
    wanted = SandboxState(record.state)
    answered: asyncio.Future[None] | None = None
    if wanted is SandboxState.RUNNING:
        # the guest's answer is all its calls wait for: pinged beside QMP's reconnect (connecting and greeting a
        # QEMU among 50 busy ones is the slower of the two), its calls go once it answers. The guest reopens its
        # port when it sees the old agent's connection close; a ping that arrives while it is closed is dropped,
        # so ping until one is answered (a paused guest cannot answer: QMP says why)
        await vm.open_guest()
        answered = asyncio.ensure_future(_answers(sandbox))
    try:
        found = await vm.reconnect(ADOPT_QMP_TIMEOUT_S)
        if wanted is SandboxState.RUNNING and found is VmState.PAUSED:
            # stopped by an operation the dead agent never finished (a snapshot's or fork's pause, a hibernation
            # whose record was not yet written): continue it, and step its clock over the gap before any call
            await _cancelled(answered)
            await vm.resume()
            await vm.wait_guest_ready(ADOPT_GUEST_TIMEOUT_S)
            assert vm.guest is not None
            await rejoin(vm.guest, record.instance_id)
        elif wanted is SandboxState.PAUSED and found is VmState.RUNNING:
            await vm.pause()
        elif answered is not None:
            await answered
    finally:
        await _cancelled(answered)
    _ready(sandbox)
    if sandbox.slot is not None:  # today's slot rules (an older agent built it), its policy served again
        if record.vm.slot_rules != slot_rules_digest(sandbox.slot):  # an nsenter + nft
            await asyncio.to_thread(load_slot_rules, sandbox.slot)
        await service.factory.apply_egress(sandbox.vm, sandbox.id, sandbox.egress, adopt=True)
    await service.persist(sandbox, read=record)


async def _answers(sandbox: Sandbox) -> None:
    """Ping the adopted guest until it answers; then its calls go ahead (lifecycle changes wait for the lock)."""
    await sandbox.vm.wait_guest_ready(ADOPT_GUEST_TIMEOUT_S)
    _ready(sandbox)


async def _cancelled(task: asyncio.Future[None] | None) -> None:
    """``task`` ended: cancelled if it still runs (what it raised is the caller's to find out otherwise)."""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _settle_in_turn(
    service: SandboxService, sandbox: Sandbox, record: SandboxRecord, gate: asyncio.Semaphore
) -> None:
    """:func:`_settle` among at most ``gate``'s many at once, or at once for a guest a request waits for; the
    sandbox's lock (taken before it was held) is released after, so no lifecycle change starts before. A guest
    that does not answer is lost: its VM is killed and its record removed."""
    readiness = sandbox.vm.readiness
    assert readiness is not None  # set by _hold
    try:
        held = await wait_turn(gate, readiness.wanted)
        if not held:  # a request waits for it: its QEMU and guest answer ahead of the idle ones too
            service.factory.set_urgent(sandbox.vm, True)
        try:
            await _settle(service, sandbox, record)
        finally:
            if held:
                gate.release()
            else:
                service.factory.set_urgent(sandbox.vm, False)
    except Exception as err:
        log.error("could not adopt sandbox %s (VM %s): %r", sandbox.id, sandbox.vm.vm_id, err)
        readiness.settle(err)
        try:
            await service.lose(sandbox)
        finally:
            sandbox.lock.release()
        return
    except BaseException as err:  # the agent stops meanwhile
        readiness.settle(err)
        sandbox.lock.release()
        raise
    _ready(sandbox)
    sandbox.lock.release()
    log.info(
        "adopted sandbox %s (VM %s, pid %s, %s)", sandbox.id, sandbox.vm.vm_id, sandbox.vm.pid, sandbox.state.value
    )


def _ready(sandbox: Sandbox) -> None:
    """The guest answers: calls waiting for it go ahead (lifecycle changes still wait for the sandbox's lock)."""
    readiness, sandbox.vm.readiness = sandbox.vm.readiness, None
    if readiness is not None:
        readiness.settle()


def _kill_recorded(record: SandboxRecord) -> None:
    if record.vm is not None and record.vm.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.vm.pid, signal.SIGKILL)
    if record.vm is not None:
        shutil.rmtree(record.vm.root, ignore_errors=True)


async def adopt(service: SandboxService, found: Survey, hibernation: SnapshotStore) -> list[str]:
    """Put every live and hibernated sandbox of ``found`` into ``service``; returns the ids that were lost.

    A live sandbox is held at once (:func:`_hold`), with its lock taken and its guest calls waiting; its
    adoption (:func:`_settle`: QMP, run state, guest, slot, record) runs in the service's background, so the agent
    serves before any VM has answered."""
    lost = [r.id for r in found.lost]
    for record in found.lost:
        _kill_recorded(record)
        await service.forget_record(record.id)
        if record.hibernation:
            await asyncio.to_thread(hibernation.delete, Path(record.hibernation).name)
    settling = asyncio.Semaphore(SETTLE_CONCURRENCY)
    for record in found.live:
        try:
            sandbox = _hold(service, record)
        except VmmError as err:  # its QEMU ended since the survey
            log.error("could not adopt sandbox %s (VM %s): %r", record.id, record.vm and record.vm.vm_id, err)
            await asyncio.to_thread(_kill_recorded, record)
            if record.vm is not None and record.vm.slot_index is not None:
                with contextlib.suppress(Exception):
                    await service.factory.slots.release(service.factory.slots.adopt(record.vm.slot_index))
            await service.forget_record(record.id)
            lost.append(record.id)
            continue
        await sandbox.lock.acquire()  # at once: nobody knows the sandbox yet
        service.adopt(sandbox)
        service.in_background(_settle_in_turn(service, sandbox, record, settling))
    for record in found.hibernated:
        assert record.hibernation is not None
        image = await asyncio.to_thread(hibernation.load, Path(record.hibernation).name)
        placeholder = service.factory.placeholder(record.id, image.machine)  # no QEMU until it wakes
        sandbox = adopted_sandbox(
            record, placeholder, service.clock(), state=SandboxState.HIBERNATED, hibernation=image
        )
        service.adopt(sandbox)  # its record stays as it was read
        log.info("adopted hibernated sandbox %s (image %s)", sandbox.id, image.id)
    if lost:
        log.warning("%d sandbox(es) did not survive the restart: %s", len(lost), ", ".join(lost))
    return lost


def sweep_hibernation(store: SnapshotStore, keep: set[str]) -> list[str]:
    """Remove hibernation images no record names (a crash between a capture and its record, or a finished wake)."""
    removed = store.sweep_partials()
    for name in store.ids():
        if name not in keep:
            store.delete(name)
            removed.append(name)
    return removed
