"""The host agent's sandbox service: the sandboxes this host holds, and create (always by restore) and delete.

Create = take a QEMU waiting in ``-incoming`` from the template's pre-spawn pool (or spawn one; for a
snapshot, always spawn one), load the device state, ``cont``, step the guest clock from the host, confirm the
agent answers; only then is the sandbox reported running. Nothing here cold-boots (bakes and forks do).

The service owns its sandboxes: they enter only through its methods (``create``; ``adopt`` for what an earlier
agent left, :mod:`..host.adopt`; ``register_child`` for a fork child, :mod:`.forking`; ``wake_here`` for a
sandbox hibernated on another host, :mod:`..hostagent.hibernations`) and leave through ``delete`` and ``close``;
everyone else reads them (``sandboxes`` is a read-only view). One id is one sandbox: an id held is refused.
The restore gate (an admission slot for the wakes it starts itself) is given once, at composition.

Lifecycle (pause/resume/hibernate/wake) is in :mod:`.lifecycle`, requests into the guest in :mod:`.guestcalls`.
Every state change is written to the sandbox's durable record (:mod:`.records`, shaped by :mod:`.mapping`)
before it is reported, so a restarted agent re-adopts running VMs and hibernated sandboxes. Delete and every
lifecycle change hold the sandbox's lock, so the reaper cannot delete a sandbox mid-wake or mid-hibernate.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ...errors import CryoboxError, NotFound, StateError
from ...netpolicy import EgressPolicy
from ..crashpoints import CrashPoints
from ..snapshot.store import SnapshotImage, SnapshotStore
from ..templates.bake import Template
from ..vm import MicroVM
from ..vm.volumes import VolumeAttach, assign_slots, settle_volumes
from .factory import RestoreSource, VmFactory, new_id
from .fidelity import rejoin
from .guestcalls import GuestCalls
from .lifecycle import ADOPTED_GUEST_TIMEOUT_S as ADOPTED_GUEST_TIMEOUT_S
from .lifecycle import Lifecycle, RestoreGate
from .mapping import sandbox_record
from .pool import PoolMode, PrespawnPool
from .records import SandboxRecord, SandboxRecords
from .sandbox import Sandbox, SandboxState
from .volumehold import join_booted

log = logging.getLogger(__name__)


class SandboxService(Lifecycle, GuestCalls):
    def __init__(
        self,
        templates: Mapping[str, Template],
        factory: VmFactory,
        hibernation: SnapshotStore,
        prespawn: int = 2,
        pool_mode: PoolMode = PoolMode.WARM,
        clock: Callable[[], float] = time.time,
        records: SandboxRecords | None = None,
        crash: CrashPoints | None = None,
        restore_gate: RestoreGate | None = None,
    ) -> None:
        self.clock = clock
        self.records = records
        self.crash = crash if crash is not None else CrashPoints()
        self._restore_gate = restore_gate
        """An admission slot for the restores the service starts by itself (a wake): :meth:`set_restore_gate`."""
        self.templates = dict(templates)
        self.factory = factory
        self.hibernation = hibernation
        self.prespawn = prespawn
        self.pool_mode = pool_mode
        self._background: set[asyncio.Task[None]] = set()
        self.pools = {name: PrespawnPool(factory, t, prespawn, pool_mode) for name, t in self.templates.items()}
        self._sandboxes: dict[str, Sandbox] = {}
        self.restoring = 0
        """Creates restoring right now (counted here, not by admission, so the bound is checked independently)."""
        self.restoring_peak = 0
        self._watchers: list[Callable[[Sandbox], None]] = []

    def start(self) -> None:
        for pool in self.pools.values():
            pool.refill()

    def set_restore_gate(self, gate: RestoreGate) -> None:
        """Make every restore the service starts by itself (a wake) wait in ``gate`` (the host agent's admission
        slot, which exists only after the service); given once, at composition."""
        if self._restore_gate is not None and self._restore_gate != gate:
            raise RuntimeError("the sandbox service's restore gate is set already")
        self._restore_gate = gate

    # -- the sandboxes held ------------------------------------------------------------------------------------

    @property
    def sandboxes(self) -> Mapping[str, Sandbox]:
        """The sandboxes held, by id (a read-only view: they enter and leave through the service's methods)."""
        return MappingProxyType(self._sandboxes)

    def held(self) -> list[Sandbox]:
        """The sandboxes held, in the order they were taken in."""
        return list(self._sandboxes.values())

    def _take(self, sandbox: Sandbox) -> None:
        """Hold ``sandbox`` under its id; an id held already is refused (``StateError``)."""
        if sandbox.id in self._sandboxes:
            raise StateError(f"sandbox {sandbox.id} already exists", state="exists", required="new")
        self._sandboxes[sandbox.id] = sandbox

    def _let_go(self, sandbox: Sandbox) -> None:
        """Stop holding ``sandbox`` (never another sandbox that holds its id now)."""
        if self._sandboxes.get(sandbox.id) is sandbox:
            del self._sandboxes[sandbox.id]

    # -- durable records ---------------------------------------------------------------------------------------

    def record_of(self, sandbox: Sandbox) -> SandboxRecord:
        return sandbox_record(sandbox, self.factory.vm_record(sandbox.vm) if sandbox.state.live else None)

    async def persist(self, sandbox: Sandbox, *, read: SandboxRecord | None = None) -> None:
        """Write the sandbox's record durably (before its new state is reported), then tell the watchers. ``read``:
        the record as an adoption read it, not written again if it is the same (50 adopted sandboxes' writes, each
        with its fsyncs, took ~0.25 s of a restart)."""
        if self.records is not None:
            record = self.record_of(sandbox)
            if record != read:
                await asyncio.to_thread(self.records.write, record)
        for watcher in self._watchers:
            try:
                watcher(sandbox)
            except Exception:  # a watcher never fails a state change
                log.exception("a watcher of sandbox %s failed", sandbox.id)

    def watch(self, watcher: Callable[[Sandbox], None]) -> None:
        """Call ``watcher`` with each sandbox the service records (every state, lifecycle or network change, after
        its record is written): the observer's journal (:mod:`..observe.journal`)."""
        self._watchers.append(watcher)

    async def forget_record(self, sandbox_id: str) -> None:
        """Remove the sandbox's record (idempotent)."""
        if self.records is not None:
            await asyncio.to_thread(self.records.remove, sandbox_id)

    # -- templates and their pools -----------------------------------------------------------------------------

    def add_template(self, template: Template, *, refill_after_s: float = 0.0) -> None:
        """Serve creates from a newly built template (replacing one of the same name); its pool fills now, or
        after ``refill_after_s`` (:meth:`PrespawnPool.refill_later`)."""
        old = self.pools.pop(template.name, None)
        if old is not None:
            self.in_background(old.close())
        self.templates[template.name] = template
        self.pools[template.name] = PrespawnPool(self.factory, template, self.prespawn, self.pool_mode)
        self.pools[template.name].refill_later(refill_after_s)

    async def remove_template(self, name: str) -> None:
        """Stop creating from ``name``; running sandboxes of it keep running. Its hot copy goes unless a
        sandbox still maps it."""
        template = self.templates.pop(name, None)
        pool = self.pools.pop(name, None)
        if pool is not None:
            await pool.close()
        if template is not None:
            hot = self.factory.hot.path(template.hot_key)
            if not any(s.vm.memory.path == hot for s in self._sandboxes.values()):
                await asyncio.to_thread(self.factory.hot.drop, template.hot_key)

    def uses_template(self, name: str) -> bool:
        return any(s.template == name for s in self._sandboxes.values())

    def in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` until it ends or the service closes (then it is cancelled)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def template(self, name: str) -> Template:
        try:
            return self.templates[name]
        except KeyError:
            raise NotFound(f"template {name!r} not found", details={"template": name}) from None

    # -- create -------------------------------------------------------------------------------------------------

    async def create(
        self,
        template: str,
        *,
        from_snapshot: SnapshotImage | None = None,
        metadata: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        ttl_s: int | None = None,
        persistent: bool = False,
        workspace_id: str = "default",
        egress: EgressPolicy | None = None,
        sandbox_id: str | None = None,
        volumes: Sequence[VolumeAttach] = (),
    ) -> Sandbox:
        """Restore a new sandbox from ``template`` (its warm pool) or from ``from_snapshot`` (a fresh QEMU
        mapping the snapshot's memory copy-on-write; any number of these run side by side). ``volumes`` join it
        before its guest runs and are mounted before it is reported running (:mod:`..vm.volumes`)."""
        source: RestoreSource = from_snapshot if from_snapshot is not None else self.template(template)
        sandbox_id = sandbox_id or new_id("sb")
        if sandbox_id in self._sandboxes:
            raise StateError(f"sandbox {sandbox_id} already exists", state="exists", required="new")
        assign_slots(source.machine, volumes)  # refused before a VM is taken: too many, or a path twice
        started = time.monotonic()
        with self._counting_restore():
            if from_snapshot is None:
                vm = await self.pools[template].take()
            else:
                vm = await self.factory.spawn_incoming(from_snapshot)
            self.crash("create.spawned")
            now = self.clock()
            sandbox = Sandbox(
                id=sandbox_id,
                template=from_snapshot.template if from_snapshot is not None else template,
                cpus=source.machine.cpus,
                memory_mib=source.machine.memory_mib,
                vm=vm,
                created_at=now,
                workspace_id=workspace_id,
                metadata=dict(metadata or {}),
                env=dict(env or {}),
                ttl_s=ttl_s,
                persistent=persistent,
                last_active=now,
                from_snapshot=from_snapshot.id if from_snapshot is not None else None,
                instance_id=vm.rejoined_as or uuid.uuid4().hex,  # a warm pool VM's guest has taken one already
                slot=self.factory.slot_of(vm),
                egress=egress,
            )
            try:
                self._take(sandbox)
                granting = self.factory.apply_egress(vm, sandbox_id, egress)
                recording = functools.partial(self._record_running, sandbox, started)
                step_ns = await self._bring_up(
                    vm, source, sandbox.instance_id, volumes, alongside=granting, beside_rejoin=recording
                )
                sandbox.boot_ms = round((time.monotonic() - started) * 1000, 1)
            except BaseException as err:
                sandbox.state = SandboxState.ERROR
                self._let_go(sandbox)
                await self.forget_record(sandbox.id)  # written beside the guest's rejoin, which failed
                cause = await self.factory.explain_failure(vm) if isinstance(err, Exception) else None
                await self.factory.destroy(vm)
                if cause is not None:
                    raise cause from err
                raise
            log.info(
                "sandbox %s restored from %s in %.0f ms (vm %s, clock stepped %+.3f s)",
                sandbox.id,
                sandbox.from_snapshot or template,
                sandbox.boot_ms,
                vm.vm_id,
                step_ns / 1e9,
            )
            return sandbox

    async def _record_running(self, sandbox: Sandbox, started: float) -> None:
        """A new sandbox's durable record, written while its guest rejoins (its VM runs; the create answers only
        once both ended, so an agent that dies before finds a record or an unrecorded VM it reclaims, and a
        rejoin that fails removes it). Its ``boot_ms`` is the restore until the guest was let run (the answer's
        counts the rejoin too; a later state change records that one)."""
        sandbox.volumes = sandbox.vm.volumes
        sandbox.state = SandboxState.RUNNING
        sandbox.boot_ms = round((time.monotonic() - started) * 1000, 1)
        self.crash("create.restored")
        await self.persist(sandbox)
        self.crash("create.recorded")

    @contextlib.contextmanager
    def _counting_restore(self) -> Iterator[None]:
        self.restoring += 1
        self.restoring_peak = max(self.restoring_peak, self.restoring)
        try:
            yield
        finally:
            self.restoring -= 1

    def get(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        """The live sandbox; another workspace's sandbox is reported as not found (404, not 403)."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None or (workspace_id is not None and sandbox.workspace_id != workspace_id):
            raise NotFound(f"sandbox {sandbox_id!r} not found", details={"id": sandbox_id})
        return sandbox

    def all(self) -> list[Sandbox]:
        return sorted(self._sandboxes.values(), key=lambda s: s.created_at)

    # -- activity: what keeps a sandbox from expiring ----------------------------------------------------------

    def touch(self, sandbox_id: str) -> Sandbox:
        """Record activity (the idle clock restarts)."""
        sandbox = self.get(sandbox_id)
        sandbox.touch(self.clock())
        return sandbox

    @contextlib.asynccontextmanager
    async def busy(self, sandbox_id: str) -> AsyncIterator[Sandbox]:
        """A request in flight: the sandbox cannot expire until it ends (and its idle clock restarts then). A
        guest error raised while the sandbox was deleted under the request is that deletion (``NotFound``)."""
        sandbox = self.get(sandbox_id)
        sandbox.in_flight += 1
        sandbox.touch(self.clock())
        try:
            yield sandbox
        except CryoboxError as err:
            if self._sandboxes.get(sandbox_id) is not sandbox and not isinstance(err, NotFound):
                raise NotFound(f"sandbox {sandbox_id} was deleted", details={"id": sandbox_id}) from err
            raise
        finally:
            sandbox.in_flight -= 1
            sandbox.touch(self.clock())

    def running(self) -> int:
        """Sandboxes whose QEMU is alive."""
        return sum(1 for s in self._sandboxes.values() if s.state.live)

    # -- sandboxes that were not created here ----------------------------------------------------------------

    def adopt(self, sandbox: Sandbox) -> None:
        """Hold a sandbox an earlier agent process left (:mod:`..host.adopt`; its record is written again, if need
        be, once its adoption is settled: :meth:`persist` with ``read``)."""
        self._take(sandbox)

    async def lose(self, sandbox: Sandbox) -> None:
        """Let go of an adopted sandbox whose guest did not come back (the caller holds its lock): its VM is killed
        and its record removed; the control plane marks it ``lost`` when the next report omits it."""
        self._let_go(sandbox)
        sandbox.state = SandboxState.STOPPED
        await self.factory.destroy(sandbox.vm)
        await self.forget_record(sandbox.id)
        await self._drop_images(sandbox)
        await self.factory.forget_egress(sandbox.id)

    async def register_child(
        self,
        child: Sandbox,
        *,
        started: float,
        paused_ms: float = 0.0,
        boot_timeout_s: float,
        volumes: Sequence[VolumeAttach] = (),
    ) -> Sandbox:
        """Hold a fork child whose VM is cold-booting (:mod:`.forking`) and bring it up: egress granted, the
        guest awaited (``boot_timeout_s``), ``volumes`` attached (:func:`.volumehold.join_booted`) and mounted
        in the guest's rejoin; then it is running and recorded. Its ``boot_ms`` counts from ``started``
        (``time.monotonic``) plus the parent's pause. On failure nothing of it stays (its VM is destroyed)."""
        try:
            assign_slots(child.vm.config, volumes)  # too many, or a path twice: refused before the boot is awaited
            self._take(child)
            await self.factory.apply_egress(child.vm, child.id, child.egress)
            await child.vm.wait_guest_ready(boot_timeout_s)
            await join_booted(child.vm, volumes)
            await rejoin(await child.vm.connect_guest(), child.instance_id, volumes=child.vm.volumes)
            child.volumes = child.vm.volumes
        except BaseException:
            self._let_go(child)
            await self.factory.destroy(child.vm)
            raise
        child.boot_ms = round(paused_ms + (time.monotonic() - started) * 1000, 1)
        child.state = SandboxState.RUNNING
        await self.persist(child)
        return child

    async def wake_here(self, sandbox: Sandbox, *, started: float) -> Sandbox:
        """Hold a sandbox hibernated on another host, its image imported into this host's hibernation store
        (:mod:`..hostagent.hibernations`): record it as hibernated here, then wake it (in the restore gate). Its
        ``boot_ms`` counts from ``started`` (``time.monotonic``, the import included). On failure nothing of it
        stays here (map, record, image); an id held already is refused."""
        try:
            self._take(sandbox)
        except StateError:
            if sandbox.hibernation is not None:
                await asyncio.to_thread(self.hibernation.delete, sandbox.hibernation.id)
            raise
        try:
            await self.persist(sandbox)
            await self.wake(sandbox.id)  # in an admission slot of its own (the restore gate)
        except BaseException:
            with contextlib.suppress(Exception):  # nothing of it stays here; the stored copy is untouched
                await self.delete(sandbox.id)
            raise
        sandbox.boot_ms = round((time.monotonic() - started) * 1000, 1)
        return sandbox

    # -- leaving ---------------------------------------------------------------------------------------------

    async def delete(self, sandbox_id: str, workspace_id: str | None = None) -> None:
        """Kill the sandbox and remove its record and images. Waits for a lifecycle change in progress (a wake,
        a hibernation, a snapshot) instead of tearing the VM out from under it."""
        sandbox = self.get(sandbox_id, workspace_id)
        async with sandbox.lock:
            if self._sandboxes.get(sandbox_id) is not sandbox:
                return  # deleted while we waited
            self._let_go(sandbox)
            sandbox.state = SandboxState.STOPPED
            await settle_volumes(sandbox.vm)  # its volumes stay: leave them clean
            await self.factory.destroy(sandbox.vm)
            self.crash("delete.killed")
            await self.forget_record(sandbox.id)
            await self._drop_images(sandbox)
            await self.factory.forget_egress(sandbox.id)

    async def _drop_images(self, sandbox: Sandbox) -> None:
        if sandbox.hibernation is not None:
            await asyncio.to_thread(self.hibernation.delete, sandbox.hibernation.id)
            sandbox.hibernation = None
        if sandbox.mapped_image is not None:
            await asyncio.to_thread(self.factory.hot.drop, sandbox.mapped_image)
            sandbox.mapped_image = None

    async def close(self, keep: bool = False) -> None:
        """Stop. Pooled QEMUs are always killed. Without ``keep`` every sandbox is killed and its record and
        images removed; with ``keep`` the sandboxes' QEMUs keep running and their records stay, for the next
        agent to adopt (hibernated sandboxes stay on disk either way only with ``keep``)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*(pool.close() for pool in self.pools.values()), return_exceptions=True)
        sandboxes = list(self._sandboxes.values())
        self._sandboxes.clear()
        if keep:
            await asyncio.gather(*(s.vm.detach() for s in sandboxes), return_exceptions=True)
            return
        vms: list[MicroVM] = [s.vm for s in sandboxes]
        await asyncio.gather(*(self.factory.destroy(vm) for vm in vms), return_exceptions=True)
        for sandbox in sandboxes:
            await self.forget_record(sandbox.id)
            await self._drop_images(sandbox)
            await self.factory.forget_egress(sandbox.id)
