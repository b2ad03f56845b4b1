"""Snapshot, fork and fork_tree on the host agent.

- ``snapshot``: capture a sandbox into the snapshot store while it keeps running (see :mod:`..vm.migration`).
- ``fork``: pause the parent, reflink-clone its disk, continue it, cold-boot a child from the clone (disk
  only: the child has the parent's files and fresh processes).
- ``fork_tree``: one snapshot, then ``count`` restores of it in parallel (memory and disk); a child that fails
  is reported in ``errors`` and does not fail the tree.

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
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CryoboxError, InvalidArgument, StateError
from ..disk.volume import clone_file
from ..snapshot.store import CaptureInfo, SnapshotImage, SnapshotStore
from ..templates.quiesce import require_quiesced
from ..vm import VmState
from .factory import new_id
from .mapping import fork_child
from .sandbox import Sandbox, SandboxState
from .service import SandboxService

log = logging.getLogger(__name__)
MAX_TREE = 16
FORK_BOOT_TIMEOUT_S = 180.0
SlotFactory = Callable[[], AbstractAsyncContextManager[None]]
"""An admission slot per child (``AdmissionController.slot``); ``None``: unbounded."""


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
    ) -> SnapshotImage:
        """Capture a running or paused sandbox (a hibernated one is woken first); it keeps its state.
        Without ``durable`` the snapshot is only restorable on this host until ``store.finish`` is called."""
        sandbox = self.service.get(sandbox_id, workspace_id)
        if sandbox.state is SandboxState.HIBERNATED:
            await self.service.wake(sandbox_id, workspace_id)
        async with sandbox.lock:
            if sandbox.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
                sandbox.require_running()
            if sandbox.volumes:  # its memory holds their mounted filesystems; a restore would find empty slots
                raise StateError(
                    f"sandbox {sandbox.id} has volumes: it cannot be snapshotted",
                    state="attached",
                    required="no volumes",
                )
            if quiesce:
                if sandbox.state is not SandboxState.RUNNING:
                    raise StateError("quiesce needs a running sandbox", state=sandbox.state.value, required="running")
                await require_quiesced(await sandbox.vm.connect_guest(), "snapshot")
            info = CaptureInfo(sandbox.template, sandbox.id, sandbox.workspace_id, sandbox.from_snapshot, labels)
            image = await self.store.begin(sandbox.vm, snapshot_id or new_id("snap"), info)
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

    async def fork(
        self,
        sandbox_id: str,
        workspace_id: str | None = None,
        *,
        metadata: dict[str, str] | None = None,
        child_id: str | None = None,
        slot: SlotFactory | None = None,
    ) -> Sandbox:
        """A child that cold-boots from a copy of the parent's disk (no memory); the boot holds a ``slot``."""
        parent = self.service.get(sandbox_id, workspace_id)
        if parent.state is SandboxState.HIBERNATED:
            await self.service.wake(sandbox_id, workspace_id)
        service = self.service
        async with parent.lock:
            if parent.state is not SandboxState.PAUSED:
                parent.require_running()
            vm = parent.vm
            disk = service.factory.run_dir / f".fork-{new_id('disk')}.qcow2"
            was_running = vm.state is VmState.RUNNING
            started = time.monotonic()
            if was_running:
                await vm.pause()
            try:
                method = await asyncio.to_thread(clone_file, vm.disk, disk)
            finally:
                if was_running:
                    await vm.resume()
            paused_ms = (time.monotonic() - started) * 1000
        log.info("fork of %s: parent paused %.1f ms (disk %s)", parent.id, paused_ms, method)
        try:
            async with self._child_slot(slot):
                return await self._boot_fork_child(parent, disk, metadata, child_id, paused_ms)
        finally:
            disk.unlink(missing_ok=True)

    async def _boot_fork_child(
        self, parent: Sandbox, disk: Path, metadata: dict[str, str] | None, child_id: str | None, paused_ms: float
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
            child, started=started, paused_ms=paused_ms, boot_timeout_s=FORK_BOOT_TIMEOUT_S
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
    ) -> TreeResult:
        """``count`` children (or one per ``child_ids`` entry, which may be none: then only the snapshot)
        restored in parallel from one snapshot of the parent (memory and disk), each holding its own ``slot``."""
        ids: list[str | None] = list(child_ids) if child_ids is not None else [None] * count
        if child_ids is None and not 1 <= count <= MAX_TREE or len(ids) > MAX_TREE:
            raise InvalidArgument(f"count must be between 1 and {MAX_TREE}", details={"count": count})
        parent = self.service.get(sandbox_id, workspace_id)
        image = await self.snapshot(sandbox_id, workspace_id, snapshot_id=snapshot_id, durable=False)
        tree = TreeResult(tree_id=tree_id or new_id("tree"), snapshot=image)
        child_meta = {**(metadata or {}), "cryobox.tree_id": tree.tree_id, "cryobox.parent_id": parent.id}
        # the children restore from the hot copy while the snapshot is made durable alongside
        finishing = asyncio.ensure_future(self.store.finish(image))
        self.service.crash("fork_tree.captured")
        results = await asyncio.gather(
            *(self._restore_child(slot, image, child_meta, parent, child) for child in ids),
            return_exceptions=True,
        )
        self.service.crash("fork_tree.children")
        try:
            tree.snapshot = await finishing
        except BaseException:
            for result in results:
                if isinstance(result, Sandbox):
                    await self.service.delete(result.id)
            raise
        for index, result in enumerate(results):
            if isinstance(result, Sandbox):
                tree.children.append(result)
            elif isinstance(result, Exception):
                message = result.message if isinstance(result, CryoboxError) else repr(result)
                tree.errors.append((index, message))
                log.warning("fork_tree %s: child %d failed: %s", tree.tree_id, index, message)
            else:
                raise result
        return tree

    async def _restore_child(
        self, slot: SlotFactory | None, image: SnapshotImage, meta: dict[str, str], parent: Sandbox, child: str | None
    ) -> Sandbox:
        async with self._child_slot(slot):
            return await self.service.create(
                image.template,
                from_snapshot=image,
                metadata=meta,
                workspace_id=parent.workspace_id,
                egress=parent.egress,
                sandbox_id=child,
            )
