"""The host agent's sandbox service: create (always by restore), exec, files, lifecycle, delete.

Create = take a QEMU waiting in ``-incoming`` from the template's pre-spawn pool (or spawn one; for a
snapshot, always spawn one), load the device state, ``cont``, step the guest clock from the host, confirm the
agent answers; only then is the sandbox reported running. Nothing here cold-boots (bakes and forks do).

Lifecycle: pause/resume stop and continue the vCPUs in place; hibernate captures the VM into the host's
hibernation store and kills QEMU; any request to a hibernated sandbox (or ``wake``) restores it first.

Every state change is written to the sandbox's durable record (:mod:`.records`) before it is reported, so a
restarted agent re-adopts running VMs and hibernated sandboxes (:mod:`.adopt`). Delete and every lifecycle
change hold the sandbox's lock, so the reaper cannot delete a sandbox mid-wake or mid-hibernate.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from ...agentapi.interface import MAX_FILE_BYTES
from ...errors import NotFound, PayloadTooLarge, StateError
from ..crashpoints import CrashPoints
from ..guest.client import FILE_REPLY, LISTING_REPLY, GuestClient, b64, unb64
from ..guest.exec import ExecEvent, ExecResult, ExecSpec, run_exec, stream_exec
from ..snapshot.store import CaptureInfo, SnapshotImage, SnapshotStore
from ..templates.bake import Template
from ..vm import MicroVM, VmState
from .factory import PoolMode, PrespawnPool, RestoreSource, VmFactory, new_id
from .fidelity import rejoin
from .records import SandboxRecord, SandboxRecords
from .sandbox import Sandbox, SandboxState

log = logging.getLogger(__name__)
ADOPTED_GUEST_TIMEOUT_S = 15.0


class SandboxService:
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
    ) -> None:
        self.clock = clock
        self.records = records
        self.crash = crash if crash is not None else CrashPoints()
        self.restore_gate: Callable[[], AbstractAsyncContextManager[None]] | None = None
        """An admission slot for the restores the service starts by itself (a wake); set by the host agent."""
        self.templates = dict(templates)
        self.factory = factory
        self.hibernation = hibernation
        self.prespawn = prespawn
        self.pool_mode = pool_mode
        self._background: set[asyncio.Task[None]] = set()
        self.pools = {name: PrespawnPool(factory, t, prespawn, pool_mode) for name, t in self.templates.items()}
        self.sandboxes: dict[str, Sandbox] = {}
        self.restoring = 0
        """Creates restoring right now (counted here, not by admission, so the bound is checked independently)."""
        self.restoring_peak = 0

    def start(self) -> None:
        for pool in self.pools.values():
            pool.refill()

    # -- durable records ---------------------------------------------------------------------------------------

    def record_of(self, sandbox: Sandbox) -> SandboxRecord:
        live = sandbox.state in (SandboxState.RUNNING, SandboxState.PAUSED)
        return SandboxRecord(
            id=sandbox.id,
            template=sandbox.template,
            cpus=sandbox.cpus,
            memory_mib=sandbox.memory_mib,
            state=sandbox.state.value,
            created_at=sandbox.created_at,
            workspace_id=sandbox.workspace_id,
            boot_mode=sandbox.boot_mode,
            boot_ms=sandbox.boot_ms,
            metadata=dict(sandbox.metadata),
            env=dict(sandbox.env),
            persistent=sandbox.persistent,
            ttl_s=sandbox.ttl_s,
            from_snapshot=sandbox.from_snapshot,
            instance_id=sandbox.instance_id,
            egress=list(sandbox.egress) if sandbox.egress is not None else None,
            vm=self.factory.vm_record(sandbox.vm) if live else None,
            hibernation=str(sandbox.hibernation.path) if sandbox.hibernation is not None else None,
            mapped_image=sandbox.mapped_image,
        )

    async def persist(self, sandbox: Sandbox) -> None:
        """Write the sandbox's record durably (before its new state is reported)."""
        if self.records is not None:
            await asyncio.to_thread(self.records.write, self.record_of(sandbox))

    async def _forget(self, sandbox_id: str) -> None:
        if self.records is not None:
            await asyncio.to_thread(self.records.remove, sandbox_id)

    def add_template(self, template: Template) -> None:
        """Serve creates from a newly built template (replacing one of the same name)."""
        old = self.pools.pop(template.name, None)
        if old is not None:
            self._spawn_background(old.close())
        self.templates[template.name] = template
        self.pools[template.name] = PrespawnPool(self.factory, template, self.prespawn, self.pool_mode)
        self.pools[template.name].refill()

    async def remove_template(self, name: str) -> None:
        """Stop creating from ``name``; running sandboxes of it keep running. Its hot copy goes unless a
        sandbox still maps it."""
        template = self.templates.pop(name, None)
        pool = self.pools.pop(name, None)
        if pool is not None:
            await pool.close()
        if template is not None:
            hot = self.factory.hot.path(template.hot_key)
            if not any(s.vm.memory.path == hot for s in self.sandboxes.values()):
                await asyncio.to_thread(self.factory.hot.drop, template.hot_key)

    def uses_template(self, name: str) -> bool:
        return any(s.template == name for s in self.sandboxes.values())

    def _spawn_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def template(self, name: str) -> Template:
        try:
            return self.templates[name]
        except KeyError:
            raise NotFound(f"template {name!r} not found", details={"template": name}) from None

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
        egress: list[str] | None = None,
        sandbox_id: str | None = None,
    ) -> Sandbox:
        """Restore a new sandbox from ``template`` (its warm pool) or from ``from_snapshot`` (a fresh QEMU
        mapping the snapshot's memory copy-on-write; any number of these run side by side)."""
        source: RestoreSource = from_snapshot if from_snapshot is not None else self.template(template)
        sandbox_id = sandbox_id or new_id("sb")
        if sandbox_id in self.sandboxes:
            raise StateError(f"sandbox {sandbox_id} already exists", state="exists", required="new")
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
                instance_id=uuid.uuid4().hex,
                slot=self.factory.slot_of(vm),
                egress=list(egress) if egress is not None else None,
            )
            self.sandboxes[sandbox.id] = sandbox
            try:
                if egress is not None:
                    await self.factory.allow_egress(vm, egress)
                step_ns = await self._bring_up(vm, source, sandbox.instance_id)
                sandbox.boot_ms = round((time.monotonic() - started) * 1000, 1)
                sandbox.state = SandboxState.RUNNING
                self.crash("create.restored")
                await self.persist(sandbox)
                self.crash("create.recorded")
            except BaseException as err:
                sandbox.state = SandboxState.ERROR
                self.sandboxes.pop(sandbox.id, None)
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

    @contextlib.contextmanager
    def _counting_restore(self) -> Iterator[None]:
        self.restoring += 1
        self.restoring_peak = max(self.restoring_peak, self.restoring)
        try:
            yield
        finally:
            self.restoring -= 1

    @staticmethod
    async def _bring_up(vm: MicroVM, source: RestoreSource, instance_id: str) -> int:
        """Continue a pooled VM or load ``source``'s state into a waiting one, then make the guest rejoin the
        world (clock, names, entropy, identity, its resume hooks: :mod:`.fidelity`). Returns the clock step."""
        if vm.state is VmState.PAUSED:  # a warm pool VM: state already loaded from the template
            await vm.resume()
        else:
            await vm.restore(source.vmstate)
        return (await rejoin(await vm.connect_guest(), instance_id)).step_ns

    def get(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        """The live sandbox; another workspace's sandbox is reported as not found (404, not 403)."""
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None or (workspace_id is not None and sandbox.workspace_id != workspace_id):
            raise NotFound(f"sandbox {sandbox_id!r} not found", details={"id": sandbox_id})
        return sandbox

    def all(self) -> list[Sandbox]:
        return sorted(self.sandboxes.values(), key=lambda s: s.created_at)

    async def delete(self, sandbox_id: str, workspace_id: str | None = None) -> None:
        """Kill the sandbox and remove its record and images. Waits for a lifecycle change in progress (a wake,
        a hibernation, a snapshot) instead of tearing the VM out from under it."""
        sandbox = self.get(sandbox_id, workspace_id)
        async with sandbox.lock:
            if self.sandboxes.get(sandbox_id) is not sandbox:
                return  # deleted while we waited
            self.sandboxes.pop(sandbox_id, None)
            sandbox.state = SandboxState.STOPPED
            await self.factory.destroy(sandbox.vm)
            self.crash("delete.killed")
            await self._forget(sandbox.id)
            await self._drop_images(sandbox)

    async def _drop_images(self, sandbox: Sandbox) -> None:
        if sandbox.hibernation is not None:
            await asyncio.to_thread(self.hibernation.delete, sandbox.hibernation.id)
            sandbox.hibernation = None
        if sandbox.mapped_image is not None:
            await asyncio.to_thread(self.factory.hot.drop, sandbox.mapped_image)
            sandbox.mapped_image = None

    async def pause(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        """Freeze the vCPUs in place (idempotent)."""
        sandbox = self.get(sandbox_id, workspace_id)
        async with sandbox.lock:
            if sandbox.state is SandboxState.RUNNING:
                await sandbox.vm.pause()
                sandbox.state = SandboxState.PAUSED
                await self.persist(sandbox)
            elif sandbox.state is not SandboxState.PAUSED:
                sandbox.require_running()
        return sandbox

    async def resume(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        """Continue a paused (or wake a hibernated) sandbox; the guest clock is stepped before it answers."""
        sandbox = self.get(sandbox_id, workspace_id)
        async with sandbox.lock:
            if sandbox.state is SandboxState.PAUSED:
                await sandbox.vm.resume()
                if sandbox.adopted:  # its guest reopens the port it saw close while paused: wait for that
                    await sandbox.vm.wait_guest_ready(ADOPTED_GUEST_TIMEOUT_S)
                await rejoin(await sandbox.vm.connect_guest(), sandbox.instance_id)
                sandbox.state = SandboxState.RUNNING
                await self.persist(sandbox)
            elif sandbox.state is SandboxState.HIBERNATED:
                await self._wake(sandbox)
            sandbox.require_running()
            sandbox.touch(self.clock())
        return sandbox

    async def hibernate(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        """Capture the sandbox to disk and stop its QEMU (idempotent); it wakes on its next request."""
        sandbox = self.get(sandbox_id, workspace_id)
        async with sandbox.lock:
            if sandbox.state is SandboxState.HIBERNATED:
                return sandbox
            if sandbox.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
                sandbox.require_running()
            info = CaptureInfo(sandbox.template, sandbox.id, sandbox.workspace_id, sandbox.from_snapshot)
            # a new image id per hibernation: the VM may map the previous image's hot copy (it woke from it)
            image_id = f"{sandbox.id}.h{secrets.token_hex(4)}"
            image = await self.hibernation.capture(sandbox.vm, image_id, info, keep_running=False)
            self.crash("hibernate.captured")
            vm, mapped = sandbox.vm, sandbox.mapped_image
            sandbox.hibernation, sandbox.mapped_image = image, None
            sandbox.state = SandboxState.HIBERNATED
            await self.persist(sandbox)  # from here on the image is the sandbox
            self.crash("hibernate.recorded")
            await self.factory.destroy(vm)
            if mapped is not None:
                await asyncio.to_thread(self.factory.hot.drop, mapped)
            log.info("sandbox %s hibernated (%d bytes)", sandbox.id, image.size_bytes)
        return sandbox

    async def wake(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        """Restore a hibernated sandbox; any other sandbox is returned as it is."""
        sandbox = self.get(sandbox_id, workspace_id)
        if sandbox.state is SandboxState.HIBERNATED:
            return await self.resume(sandbox_id, workspace_id)
        return sandbox

    async def _wake(self, sandbox: Sandbox) -> None:
        """Restore a hibernated sandbox into a new QEMU (caller holds the sandbox lock)."""
        image = sandbox.hibernation
        if image is None:
            raise StateError(f"sandbox {sandbox.id} has no hibernation image", state=sandbox.state.value)
        started = time.monotonic()
        async with self.restore_gate() if self.restore_gate is not None else contextlib.nullcontext():
            await self._wake_restore(sandbox, image)
        # the image's files go; its hot copy stays while this VM maps it (a later snapshot reads that mapping)
        await asyncio.to_thread(functools.partial(self.hibernation.delete, image.id, keep_hot=True))
        log.info("sandbox %s woke in %.0f ms", sandbox.id, (time.monotonic() - started) * 1000)

    async def _wake_restore(self, sandbox: Sandbox, image: SnapshotImage) -> None:
        vm = await self.factory.spawn_incoming(image)
        try:
            self.crash("wake.spawned")
            if sandbox.egress is not None:
                await self.factory.allow_egress(vm, sandbox.egress)
            await self._bring_up(vm, image, sandbox.instance_id)
            self.crash("wake.restored")
            sandbox.vm = vm
            sandbox.slot = self.factory.slot_of(vm)
            sandbox.hibernation, sandbox.mapped_image = None, image.id
            sandbox.state = SandboxState.RUNNING
            await self.persist(sandbox)
        except BaseException:
            sandbox.hibernation, sandbox.mapped_image, sandbox.state = image, None, SandboxState.HIBERNATED
            await self.factory.destroy(vm)
            raise

    async def guest(self, sandbox_id: str, workspace_id: str | None = None) -> tuple[Sandbox, GuestClient]:
        sandbox = self.get(sandbox_id, workspace_id)
        if sandbox.state is SandboxState.HIBERNATED:  # any request wakes it
            await self.resume(sandbox_id, workspace_id)
        sandbox.require_running()
        sandbox.touch(self.clock())
        return sandbox, await sandbox.vm.connect_guest()

    def _spec(self, sandbox: Sandbox, spec: ExecSpec) -> ExecSpec:
        if not sandbox.env:
            return spec
        return ExecSpec(
            cmd=spec.cmd, timeout_s=spec.timeout_s, env={**sandbox.env, **spec.env}, cwd=spec.cwd, stdin=spec.stdin
        )

    async def exec(self, sandbox_id: str, spec: ExecSpec, workspace_id: str | None = None) -> ExecResult:
        sandbox, guest = await self.guest(sandbox_id, workspace_id)
        return await run_exec(guest, self._spec(sandbox, spec))

    async def exec_stream(
        self, sandbox_id: str, spec: ExecSpec, workspace_id: str | None = None
    ) -> AsyncIterator[ExecEvent]:
        sandbox, guest = await self.guest(sandbox_id, workspace_id)
        async for event in stream_exec(guest, self._spec(sandbox, spec)):
            yield event

    async def read_file(self, sandbox_id: str, path: str, workspace_id: str | None = None) -> bytes:
        _, guest = await self.guest(sandbox_id, workspace_id)
        return unb64((await guest.call("read_file", {"path": path}, timeout=120, max_reply=FILE_REPLY)).get("content"))

    async def write_file(
        self, sandbox_id: str, path: str, data: bytes, workspace_id: str | None = None, *, user: str | None = None
    ) -> dict[str, Any]:
        if len(data) > MAX_FILE_BYTES:
            raise PayloadTooLarge(f"file of {len(data)} bytes exceeds {MAX_FILE_BYTES}")
        _, guest = await self.guest(sandbox_id, workspace_id)
        args: dict[str, Any] = {"path": path, "content": b64(data)}
        if user is not None:
            args["user"] = user  # what the write creates (the file, missing parents) is owned by that user
        return await guest.call("write_file", args, timeout=120)

    async def inspect_net(self, sandbox_id: str, workspace_id: str | None = None) -> dict[str, Any]:
        """The guest's sockets, neighbours, resolver config, interfaces, clocks and instance id."""
        _, guest = await self.guest(sandbox_id, workspace_id)
        return await guest.call("inspect_net", {}, timeout=60)

    async def file_op(self, sandbox_id: str, op: str, path: str, workspace_id: str | None = None) -> dict[str, Any]:
        _, guest = await self.guest(sandbox_id, workspace_id)
        return await guest.call(op, {"path": path}, timeout=60, max_reply=LISTING_REPLY)

    async def hibernate_all(self, concurrency: int = 4) -> int:
        """Hibernate every running or paused sandbox (``--on-stop hibernate``); returns how many failed."""
        gate = asyncio.Semaphore(concurrency)

        async def one(sandbox_id: str) -> None:
            async with gate:
                await self.hibernate(sandbox_id)

        live = [s.id for s in self.sandboxes.values() if s.state in (SandboxState.RUNNING, SandboxState.PAUSED)]
        results = await asyncio.gather(*(one(i) for i in live), return_exceptions=True)
        for sandbox_id, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                log.error("could not hibernate %s at stop: %s", sandbox_id, result)
        return sum(1 for r in results if isinstance(r, BaseException))

    def running(self) -> int:
        """Sandboxes whose QEMU is alive."""
        return sum(1 for s in self.sandboxes.values() if s.state in (SandboxState.RUNNING, SandboxState.PAUSED))

    async def close(self, keep: bool = False) -> None:
        """Stop. Pooled QEMUs are always killed. Without ``keep`` every sandbox is killed and its record and
        images removed; with ``keep`` the sandboxes' QEMUs keep running and their records stay, for the next
        agent to adopt (hibernated sandboxes stay on disk either way only with ``keep``)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*(pool.close() for pool in self.pools.values()), return_exceptions=True)
        sandboxes = list(self.sandboxes.values())
        self.sandboxes.clear()
        if keep:
            await asyncio.gather(*(s.vm.detach() for s in sandboxes), return_exceptions=True)
            return
        vms: list[MicroVM] = [s.vm for s in sandboxes]
        await asyncio.gather(*(self.factory.destroy(vm) for vm in vms), return_exceptions=True)
        for sandbox in sandboxes:
            await self._forget(sandbox.id)
            await self._drop_images(sandbox)
