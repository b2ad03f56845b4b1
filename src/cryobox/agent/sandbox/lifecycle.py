"""A held sandbox's state changes: pause, resume, hibernate, wake (mixed into :class:`~.service.SandboxService`).

The states and what moves between them::

    running --pause--> paused --resume--> running
    running|paused --hibernate--> hibernated --wake|resume|any request--> running
    anything else (starting, stopped, error) refuses these with StateError; pause of a paused, hibernate of a
    hibernated and wake of a running sandbox are no-ops

Pause and resume stop and continue the vCPUs in place (the guest clock is stepped on resume); hibernate captures
the VM into the host's hibernation store, records the sandbox as hibernated and only then kills QEMU; a wake
restores the image into a new QEMU (holding the restore gate, an admission slot, like a create), records it
running and only then deletes the image's files. Every change holds the sandbox's lock and is written to its
durable record before it is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from ...errors import StateError
from ...netpolicy import EgressPolicy
from ..crashpoints import CrashPoints
from ..snapshot.store import CaptureInfo, SnapshotImage, SnapshotStore
from ..vm import MicroVM, VmState
from ..vm.volumes import AttachedVolume, VolumeAttach, attach_volumes
from .factory import RestoreSource, VmFactory
from .fidelity import rejoin
from .sandbox import Sandbox, SandboxState

log = logging.getLogger(__name__)
ADOPTED_GUEST_TIMEOUT_S = 15.0
UNCHANGED = object()
"""``set_lifecycle``'s "leave the TTL as it is" (``None`` is a TTL: never expire)."""
RestoreGate = Callable[[], AbstractAsyncContextManager[None]]
"""An admission slot for a restore the service starts by itself (a wake): ``AdmissionController.slot``."""


async def both(first: Awaitable[object], second: Awaitable[object] | None) -> None:
    """Run ``first`` and ``second`` side by side until both ended; raises the first one's failure first."""
    results = await asyncio.gather(first, *([second] if second is not None else []), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def reattach(volumes: Sequence[AttachedVolume]) -> tuple[VolumeAttach, ...]:
    """What re-attaches ``volumes`` to a new VM of the same sandbox, in the same slots (same order)."""
    return tuple(VolumeAttach(Path(v.path), v.read_only, v.mount_path, v.name) for v in volumes)


class Lifecycle:
    """The state changes of :class:`~.service.SandboxService` (which provides the attributes and ``get``,
    ``persist`` and ``held`` below)."""

    clock: Callable[[], float]
    crash: CrashPoints
    factory: VmFactory
    hibernation: SnapshotStore
    _restore_gate: RestoreGate | None

    def get(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        raise NotImplementedError  # SandboxService's

    def held(self) -> list[Sandbox]:
        raise NotImplementedError  # SandboxService's

    async def persist(self, sandbox: Sandbox) -> None:
        raise NotImplementedError  # SandboxService's

    @staticmethod
    async def _bring_up(
        vm: MicroVM,
        source: RestoreSource,
        instance_id: str,
        volumes: Sequence[VolumeAttach] = (),
        *,
        mount: bool = True,
        alongside: Awaitable[object] | None = None,
        beside_rejoin: Callable[[], Awaitable[object]] | None = None,
    ) -> int:
        """Continue a pooled VM or load ``source``'s state into a waiting one, then make the guest rejoin the
        world (clock, names, entropy, identity, its resume hooks: :mod:`.fidelity`). Returns the clock step.

        ``volumes`` are attached while the vCPUs are still stopped (:mod:`..vm.volumes`) and, with ``mount``,
        mounted by the guest in the same ``resume`` call (a woken guest has them mounted already). A paused VM's
        attach runs side by side with ``alongside`` (host-side work of the same create: its egress), which is
        otherwise awaited first. Without volumes the path is exactly the volume-less one. ``beside_rejoin`` (the
        create's durable record) runs while the guest rejoins, once its vCPUs run; both end before this returns."""
        if vm.state is VmState.PAUSED and volumes:  # a warm pool VM: state already loaded from the template
            await both(attach_volumes(vm, volumes), alongside)
            await vm.resume()
        else:
            if alongside is not None:
                await alongside
            if vm.state is VmState.PAUSED:
                await vm.resume()
            elif volumes:
                await vm.restore(source.vmstate, prepare=functools.partial(attach_volumes, vm, volumes))
            else:
                await vm.restore(source.vmstate)

        rejoined, vm.rejoined_as = vm.rejoined_as == instance_id, None  # a warm pool VM, warmed as this instance

        async def join() -> int:
            guest = await vm.connect_guest()
            report = await rejoin(guest, instance_id, volumes=vm.volumes if mount else (), rejoined=rejoined)
            return report.step_ns

        if beside_rejoin is None:
            return await join()
        joining = asyncio.ensure_future(join())
        await both(joining, beside_rejoin())
        return joining.result()

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
            if not sandbox.state.live:
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

    async def set_lifecycle(
        self, sandbox_id: str, *, ttl_s: int | None | object = UNCHANGED, persistent: bool | None = None
    ) -> Sandbox:
        """Change the idle TTL (``None``: never expires) and/or persistence, durably (a restarted agent adopts the
        sandbox with them); counts as activity."""
        sandbox = self.get(sandbox_id)
        async with sandbox.lock:
            if ttl_s is not UNCHANGED:
                if ttl_s is not None and not isinstance(ttl_s, int):
                    raise TypeError(f"ttl_s must be an int or None, not {type(ttl_s).__name__}")
                sandbox.ttl_s = ttl_s
            if persistent is not None:
                sandbox.persistent = persistent
            sandbox.touch(self.clock())
            await self.persist(sandbox)
        return sandbox

    async def set_network(self, sandbox_id: str, policy: EgressPolicy) -> Sandbox:
        """Replace the sandbox's network policy, durably. A sandbox with a VM (running or paused) has it enforced
        at once: new connections and queries see it, open connections it denies are cut. A hibernated one gets it
        when it wakes."""
        sandbox = self.get(sandbox_id)
        async with sandbox.lock:
            sandbox.egress = policy
            if self.factory.slot_of(sandbox.vm) is not None:
                await self.factory.apply_egress(sandbox.vm, sandbox.id, policy)
            await self.persist(sandbox)
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
        async with self._restore_gate() if self._restore_gate is not None else contextlib.nullcontext():
            await self._wake_restore(sandbox, image)
        # the image's files go; its hot copy stays while this VM maps it (a later snapshot reads that mapping)
        await asyncio.to_thread(functools.partial(self.hibernation.delete, image.id, keep_hot=True))
        log.info("sandbox %s woke in %.0f ms", sandbox.id, (time.monotonic() - started) * 1000)

    async def _wake_restore(self, sandbox: Sandbox, image: SnapshotImage) -> None:
        vm = await self.factory.spawn_incoming(image)
        try:
            self.crash("wake.spawned")
            await self.factory.apply_egress(vm, sandbox.id, sandbox.egress)
            # its volumes come back in the same slots; the guest's memory has them mounted already
            await self._bring_up(vm, image, sandbox.instance_id, reattach(sandbox.volumes), mount=False)
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

    async def hibernate_all(self, concurrency: int = 4) -> int:
        """Hibernate every running or paused sandbox (``--on-stop hibernate``); returns how many failed."""
        gate = asyncio.Semaphore(concurrency)

        async def one(sandbox_id: str) -> None:
            async with gate:
                await self.hibernate(sandbox_id)

        live = [s.id for s in self.held() if s.state.live]
        results = await asyncio.gather(*(one(i) for i in live), return_exceptions=True)
        for sandbox_id, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                log.error("could not hibernate %s at stop: %s", sandbox_id, result)
        return sum(1 for r in results if isinstance(r, BaseException))
