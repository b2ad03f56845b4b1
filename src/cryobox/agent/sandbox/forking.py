"""Snapshot, fork and fork_tree on the host agent.

- ``snapshot``: capture a sandbox into the snapshot store while it keeps running (see :mod:`..vm.migration`);
  a sandbox with volumes has its guest release them around the capture (:mod:`.volumehold`): the snapshot
  records the mounts, not the volumes' bytes.
- ``fork``: pause the parent, reflink-clone its disk (and the images of the volumes its child gets as clones),
  continue it, cold-boot a child from the clone (disk only: the child has the parent's files and fresh
  processes); the child's volumes join once its guest answers.
- ``fork_tree``: one snapshot, then ``count`` restores of it in parallel (memory and disk); a child that fails
  is reported in ``errors`` and does not fail the tree. Volume clones for the children are made while the
  parent's guest has its volumes released for the capture; each child restores with its own.

Every child's boot or restore holds its own admission slot (``slot``: the host agent's
``AdmissionController.slot``), so a tree of 16 restores at most ``CRYOBOX_MAX_CONCURRENT_RESTORES`` at once;
the parent's own capture takes none. ``children_restoring`` / ``children_peak`` count them where they happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CryoboxError, InvalidArgument, StateError
from ..disk.volume import clone_file
from ..snapshot.store import CaptureInfo, SnapshotImage, SnapshotStore
from ..templates.quiesce import require_quiesced
from ..vm import VmState
from ..vm.volumes import VolumeAttach, assign_slots
from ..volumes.clones import VolumeClone, drop_clones, make_clones
from .factory import new_id
from .mapping import fork_child
from .sandbox import Sandbox, SandboxState
from .service import SandboxService
from .volumehold import release_volumes, remount_volumes

log = logging.getLogger(__name__)
MAX_TREE = 16
FORK_BOOT_TIMEOUT_S = 180.0
SlotFactory = Callable[[], AbstractAsyncContextManager[None]]
"""An admission slot per child (``AdmissionController.slot``); ``None``: unbounded."""
ChildVolumes = Mapping[str, Sequence[VolumeAttach]]
"""Per child id, the volumes it gets (its clones' images among them)."""
ChildClones = Mapping[str, Sequence[VolumeClone]]
"""Per child id, the volume images made for it as clones of the parent's."""


@dataclass
class TreeResult:
    tree_id: str
    snapshot: SnapshotImage
    children: list[Sandbox] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)


class Forking:
    def __init__(self, service: SandboxService, store: SnapshotStore) -> None:
        self.service = service
        self.store = store
        self.children_restoring = 0
        """Fork and tree children booting or restoring right now (counted here, independently of admission)."""
        self.children_peak = 0

    @contextlib.asynccontextmanager
    async def _child_slot(self, slot: SlotFactory | None) -> AsyncIterator[None]:
        """Hold an admission slot (when given) for one child's boot or restore, and count it."""
        async with slot() if slot is not None else contextlib.nullcontext():
            self.children_restoring += 1
            self.children_peak = max(self.children_peak, self.children_restoring)
            try:
                yield
            finally:
                self.children_restoring -= 1

    async def snapshot(
        self,
        sandbox_id: str,
        workspace_id: str | None = None,
        *,
        snapshot_id: str | None = None,
        labels: dict[str, str] | None = None,
        quiesce: bool = False,
        durable: bool = True,
        released: Callable[[], Awaitable[object]] | None = None,
    ) -> SnapshotImage:
        """Capture a running or paused sandbox (a hibernated one is woken first); it keeps its state. A sandbox
        with volumes must be running: its guest releases them for the capture and mounts them again after it
        (``released`` runs in between, after the capture: the volume clones of a tree). Without ``durable``
        the snapshot is only restorable on this host until ``store.finish`` is called."""
        sandbox = self.service.get(sandbox_id, workspace_id)
        if sandbox.state is SandboxState.HIBERNATED:
            await self.service.wake(sandbox_id, workspace_id)
        async with sandbox.lock:
            if sandbox.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
                sandbox.require_running()
            if quiesce:
                if sandbox.state is not SandboxState.RUNNING:
                    raise StateError("quiesce needs a running sandbox", state=sandbox.state.value, required="running")
                await require_quiesced(await sandbox.vm.connect_guest(), "snapshot")
            info = CaptureInfo(sandbox.template, sandbox.id, sandbox.workspace_id, sandbox.from_snapshot, labels)
            image = await self._capture(sandbox, snapshot_id or new_id("snap"), info, released)
        self.service.crash("snapshot.captured")
        if durable:
            image = await self.store.finish(image)
            self.service.crash("snapshot.finished")
        sandbox.touch(self.service.clock())
        log.info(
            "snapshot %s of %s: paused %.1f ms, %.0f ms in all",
            image.id,
            sandbox.id,
            image.pause_ms,
            image.manifest["capture"]["total_ms"],
        )
        return image

    async def _capture(
        self,
        sandbox: Sandbox,
        snapshot_id: str,
        info: CaptureInfo,
        released: Callable[[], Awaitable[object]] | None,
    ) -> SnapshotImage:
        """``store.begin`` with the sandbox's volumes released around it (``released`` run after the capture, before
        they are mounted again); a failure anywhere leaves no snapshot and the volumes mounted as they were."""
        vm = sandbox.vm
        started = time.monotonic()
        again = await release_volumes(vm, sandbox.id) if sandbox.volumes else []  # 409 volume_busy: as it was
        try:
            image = await self.store.begin(vm, snapshot_id, info)
        except BaseException:
            await remount_volumes(vm, again)
            raise
        try:
            try:
                if released is not None:
                    await released()
            finally:
                await remount_volumes(vm, again)
        except BaseException:
            await asyncio.to_thread(self.store.delete, image.id)
            raise
        if sandbox.volumes:
            log.info(
                "snapshot %s of %s with %d volumes released and mounted again: %.0f ms (capture paused %.1f ms)",
                image.id,
                sandbox.id,
                len(sandbox.volumes),
                (time.monotonic() - started) * 1000,
                image.pause_ms,
            )
        return image

    async def fork(
        self,
        sandbox_id: str,
        workspace_id: str | None = None,
        *,
        metadata: dict[str, str] | None = None,
        child_id: str | None = None,
        slot: SlotFactory | None = None,
        volumes: Sequence[VolumeAttach] = (),
        clones: Sequence[VolumeClone] = (),
    ) -> Sandbox:
        """A child that cold-boots from a copy of the parent's disk (no memory); the boot holds a ``slot``. It
        gets ``volumes`` once its guest answers; ``clones`` (images among them) are made inside the parent's
        pause, like the disk copy (crash-consistent), and removed again if the child fails."""
        parent = self.service.get(sandbox_id, workspace_id)
        if parent.state is SandboxState.HIBERNATED:
            await self.service.wake(sandbox_id, workspace_id)
        service = self.service
        async with parent.lock:
            if parent.state is not SandboxState.PAUSED:
                parent.require_running()
            vm = parent.vm
            assign_slots(vm.config, volumes)  # too many, or a path twice: refused before anything is copied
            disk = service.factory.run_dir / f".fork-{new_id('disk')}.qcow2"
            was_running = vm.state is VmState.RUNNING
            started = time.monotonic()
            if was_running:
                await vm.pause()
            try:
                method = await asyncio.to_thread(clone_file, vm.disk, disk)
                if clones:
                    method += f", volumes {'/'.join(await asyncio.to_thread(make_clones, clones))}"
            except BaseException:
                disk.unlink(missing_ok=True)
                raise
            finally:
                if was_running:
                    await vm.resume()
            paused_ms = (time.monotonic() - started) * 1000
        log.info("fork of %s: parent paused %.1f ms (disk %s)", parent.id, paused_ms, method)
        try:
            async with self._child_slot(slot):
                return await self._boot_fork_child(parent, disk, metadata, child_id, paused_ms, volumes)
        except BaseException:
            await asyncio.to_thread(drop_clones, clones)
            raise
        finally:
            disk.unlink(missing_ok=True)

    async def _boot_fork_child(
        self,
        parent: Sandbox,
        disk: Path,
        metadata: dict[str, str] | None,
        child_id: str | None,
        paused_ms: float,
        volumes: Sequence[VolumeAttach],
    ) -> Sandbox:
        service = self.service
        started = time.monotonic()
        try:
            child_vm = await service.factory.spawn_cold(parent.vm.config, disk)
        finally:
            disk.unlink(missing_ok=True)
        child = fork_child(
            parent,
            child_id or new_id("sb"),
            child_vm,
            service.clock(),
            metadata=dict(metadata or {}),
            instance_id=uuid.uuid4().hex,
            slot=service.factory.slot_of(child_vm),
        )
        return await service.register_child(
            child, started=started, paused_ms=paused_ms, boot_timeout_s=FORK_BOOT_TIMEOUT_S, volumes=volumes
        )

    async def fork_tree(
        self,
        sandbox_id: str,
        workspace_id: str | None = None,
        *,
        count: int = 2,
        metadata: dict[str, str] | None = None,
        snapshot_id: str | None = None,
        child_ids: list[str] | None = None,
        tree_id: str | None = None,
        slot: SlotFactory | None = None,
        volumes: ChildVolumes | None = None,
        clones: ChildClones | None = None,
    ) -> TreeResult:
        """``count`` children (or one per ``child_ids`` entry, which may be none: then only the snapshot)
        restored in parallel from one snapshot of the parent (memory and disk), each holding its own ``slot``.
        A child gets its ``volumes`` (by child id); its ``clones`` are made while the parent's guest has its
        volumes released for the capture, and removed again if the child fails (or the tree does)."""
        ids: list[str | None] = list(child_ids) if child_ids is not None else [None] * count
        if child_ids is None and not 1 <= count <= MAX_TREE or len(ids) > MAX_TREE:
            raise InvalidArgument(f"count must be between 1 and {MAX_TREE}", details={"count": count})
        volumes, clones = volumes or {}, clones or {}
        if not set(volumes) | set(clones) <= set(child_ids or ()):
            raise InvalidArgument("volumes given for a child that is not asked for", details={"field": "volumes"})
        parent = self.service.get(sandbox_id, workspace_id)
        every_clone = [clone for child in ids if child is not None for clone in clones.get(child, ())]

        async def make() -> None:
            if every_clone:
                await asyncio.to_thread(make_clones, every_clone)

        try:
            image = await self.snapshot(sandbox_id, workspace_id, snapshot_id=snapshot_id, durable=False, released=make)
        except BaseException:
            await asyncio.to_thread(drop_clones, every_clone)  # made, but the parent's volumes did not mount again
            raise
        tree = TreeResult(tree_id=tree_id or new_id("tree"), snapshot=image)
        child_meta = {**(metadata or {}), "cryobox.tree_id": tree.tree_id, "cryobox.parent_id": parent.id}
        # the children restore from the hot copy while the snapshot is made durable alongside
        finishing = asyncio.ensure_future(self.store.finish(image))
        self.service.crash("fork_tree.captured")
        results = await asyncio.gather(
            *(
                self._restore_child(slot, image, child_meta, parent, child, volumes.get(child or "", ()))
                for child in ids
            ),
            return_exceptions=True,
        )
        self.service.crash("fork_tree.children")
        try:
            tree.snapshot = await finishing
        except BaseException:
            for result in results:
                if isinstance(result, Sandbox):
                    await self.service.delete(result.id)
            await asyncio.to_thread(drop_clones, every_clone)
            raise
        for index, result in enumerate(results):
            if isinstance(result, Sandbox):
                tree.children.append(result)
                continue
            await asyncio.to_thread(drop_clones, clones.get(ids[index] or "", ()))
            if isinstance(result, Exception):
                message = result.message if isinstance(result, CryoboxError) else repr(result)
                tree.errors.append((index, message))
                log.warning("fork_tree %s: child %d failed: %s", tree.tree_id, index, message)
            else:
                raise result
        return tree

    async def _restore_child(
        self,
        slot: SlotFactory | None,
        image: SnapshotImage,
        meta: dict[str, str],
        parent: Sandbox,
        child: str | None,
        volumes: Sequence[VolumeAttach],
    ) -> Sandbox:
        async with self._child_slot(slot):
            return await self.service.create(
                image.template,
                from_snapshot=image,
                metadata=meta,
                workspace_id=parent.workspace_id,
                egress=parent.egress,
                sandbox_id=child,
                volumes=volumes,
            )
