"""The control plane's snapshot, fork and retention operations (registry + host agent together).

Ordering rules (a crash at any step loses no record and leaks no files):

- take: files first (manifest written last), then the row; a failed row insert removes the files.
- delete: the row first, then the files; files without a row are removed by ``reconcile_files`` at start.
- a sandbox delete deletes its snapshots unless they are ``retain`` or the delete says ``keep_snapshots``;
  those that stay become orphans (``orphaned_at``), and orphans that are not ``retain`` are deleted by the
  sweep once their grace period has passed, never before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..agent.forking import Forking, TreeResult
from ..agent.sandbox import Sandbox
from ..agent.store import evidence
from ..agent.store.objstore import ObjectStore
from ..agent.store.publish import import_snapshot, publish_snapshot, snapshot_prefix
from ..agent.store.snapshots import SnapshotImage, SnapshotStore
from ..errors import CryoboxError, InvalidArgument, NotFound, ObjectNotFound, StateError
from ..registry import Registry, SnapshotRow

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 7 * 24 * 3600.0
DEFAULT_SWEEP_INTERVAL_S = 15 * 60.0


@dataclass(frozen=True)
class RetentionPolicy:
    """How long orphaned snapshots are kept, and how often the sweep looks for expired ones."""

    grace_s: float = DEFAULT_GRACE_S
    sweep_interval_s: float = DEFAULT_SWEEP_INTERVAL_S

    @classmethod
    def from_env(
        cls, grace_s: float | None = None, sweep_interval_s: float | None = None, env: dict[str, str] | None = None
    ) -> RetentionPolicy:
        environ = os.environ if env is None else env

        def pick(given: float | None, name: str, default: float) -> float:
            if given is not None:
                value = given
            else:
                raw = environ.get(name)
                try:
                    value = float(raw) if raw else default
                except ValueError:
                    raise InvalidArgument(f"{name} must be a number of seconds, not {raw!r}") from None
            if not value >= 0:  # also NaN, which would disable the sweep without a word
                raise InvalidArgument(f"{name} must be a non-negative number of seconds, not {value!r}")
            return value

        policy = cls(
            grace_s=pick(grace_s, "CRYOBOX_SNAPSHOT_GRACE_S", DEFAULT_GRACE_S),
            sweep_interval_s=pick(sweep_interval_s, "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S", DEFAULT_SWEEP_INTERVAL_S),
        )
        if policy.sweep_interval_s < 0.1:
            raise InvalidArgument("the orphan sweep interval must be at least 0.1 s")
        return policy


def snapshot_row(image: SnapshotImage, workspace_id: str, retain: bool, labels: dict[str, str]) -> SnapshotRow:
    return SnapshotRow(
        id=image.id,
        workspace_id=workspace_id,
        template=image.template,
        path=str(image.path),
        sandbox_id=image.manifest.get("sandbox_id"),
        parent_id=image.manifest.get("parent"),
        size_bytes=image.size_bytes,
        pause_ms=image.pause_ms,
        labels=dict(labels),
        retain=retain,
        created_at=float(image.manifest["created_at"]),
    )


class SnapshotControl:
    def __init__(
        self,
        registry: Registry,
        store: SnapshotStore,
        forking: Forking,
        clock: Callable[[], float],
        retention: RetentionPolicy,
        objects: ObjectStore | None = None,
        work_dir: Path | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.forking = forking
        self.clock = clock
        self.retention = retention
        self.objects = objects
        self.work_dir = work_dir

    def _objects(self) -> ObjectStore:
        if self.objects is None:
            raise StateError("this server has no object store")
        return self.objects

    async def publish(self, snapshot_id: str, workspace_id: str) -> dict[str, str]:
        """Upload a snapshot to the object store so another host can import it."""
        image = await self.image(snapshot_id, workspace_id)
        template = self.forking.service.template(image.template)
        objects = self._objects()
        work = self.work_dir or self.store.root / ".publish"
        key = await asyncio.to_thread(publish_snapshot, objects, image, template, work)
        return {"id": snapshot_id, "store": objects.url, "key": key}

    async def import_published(
        self, snapshot_id: str, workspace_id: str, *, labels: dict[str, str], retain: bool
    ) -> SnapshotRow:
        """Register a snapshot another host published: its small files come here, its memory stays in the
        store and is paged in by the restores. The row belongs to the caller's workspace."""
        objects = self._objects()
        try:
            manifest = json.loads(await asyncio.to_thread(objects.get, f"{snapshot_prefix(snapshot_id)}/manifest.json"))
        except ObjectNotFound:
            raise NotFound(
                f"snapshot {snapshot_id!r} is not published in {objects.url}", details={"id": snapshot_id}
            ) from None
        template = self.forking.service.template(str(manifest.get("template")))
        await asyncio.to_thread(import_snapshot, objects, snapshot_id, self.store.root, template)
        image = await asyncio.to_thread(self.store.load, snapshot_id)
        merged = {**image.manifest.get("labels", {}), **labels}
        return await self._record(image, workspace_id, retain, merged)

    async def _record(
        self, image: SnapshotImage, workspace_id: str, retain: bool, labels: dict[str, str]
    ) -> SnapshotRow:
        row = snapshot_row(image, workspace_id, retain, labels)
        try:
            await asyncio.to_thread(self.registry.add_snapshot, row)
        except BaseException:
            await asyncio.to_thread(self.store.delete, image.id)
            raise
        return row

    async def take(
        self, sandbox_id: str, workspace_id: str, *, labels: dict[str, str], retain: bool, quiesce: bool
    ) -> SnapshotRow:
        image = await self.forking.snapshot(sandbox_id, workspace_id, labels=labels, quiesce=quiesce)
        return await self._record(image, workspace_id, retain, labels)

    async def image(self, snapshot_id: str, workspace_id: str) -> SnapshotImage:
        """The files of a snapshot the caller can see (404 otherwise)."""
        await asyncio.to_thread(self.registry.get_snapshot, snapshot_id, workspace_id)
        return await asyncio.to_thread(self.store.load, snapshot_id)

    async def evidence_list(self, snapshot_id: str, workspace_id: str) -> list[dict[str, object]]:
        row = await self.get(snapshot_id, workspace_id)
        return await asyncio.to_thread(evidence.listing, Path(row.path))

    async def evidence_read(self, snapshot_id: str, workspace_id: str, name: str) -> bytes:
        row = await self.get(snapshot_id, workspace_id)
        return await asyncio.to_thread(evidence.read, Path(row.path), name)

    async def evidence_put(self, snapshot_id: str, workspace_id: str, name: str, data: bytes) -> int:
        row = await self.get(snapshot_id, workspace_id)
        return await asyncio.to_thread(evidence.put, Path(row.path), name, data)

    async def get(self, snapshot_id: str, workspace_id: str) -> SnapshotRow:
        return await asyncio.to_thread(self.registry.get_snapshot, snapshot_id, workspace_id)

    async def list_rows(self, workspace_id: str, sandbox_id: str | None, labels: dict[str, str]) -> list[SnapshotRow]:
        return await asyncio.to_thread(self.registry.list_snapshots, workspace_id, sandbox_id, labels or None)

    async def update(
        self, snapshot_id: str, workspace_id: str, *, labels: dict[str, str] | None, retain: bool | None
    ) -> SnapshotRow:
        await self.get(snapshot_id, workspace_id)
        changes: dict[str, object] = {}
        if labels is not None:
            changes["labels"] = dict(labels)
        if retain is not None:
            changes["retain"] = retain
        if not changes:
            raise InvalidArgument("nothing to update: give labels and/or retain")
        return await asyncio.to_thread(functools.partial(self.registry.update_snapshot, snapshot_id, **changes))

    async def delete(self, snapshot_id: str, workspace_id: str | None) -> None:
        """Row first, then files (local and the hot copy)."""
        if workspace_id is not None:
            await self.get(snapshot_id, workspace_id)
        await asyncio.to_thread(self.registry.delete_snapshot, snapshot_id)
        await asyncio.to_thread(self.store.delete, snapshot_id)

    async def sandbox_gone(self, sandbox_id: str, *, keep_snapshots: bool) -> tuple[list[str], list[str]]:
        """Apply retention when a sandbox is deleted: returns (deleted, orphaned) snapshot ids."""
        deleted, orphaned = [], []
        now = self.clock()
        for row in await asyncio.to_thread(self.registry.list_snapshots, None, sandbox_id):
            if row.retain or keep_snapshots:
                if row.orphaned_at is None:
                    await asyncio.to_thread(functools.partial(self.registry.update_snapshot, row.id, orphaned_at=now))
                orphaned.append(row.id)
            else:
                await self.delete(row.id, None)
                deleted.append(row.id)
        return deleted, orphaned

    async def sweep(self) -> list[str]:
        """Delete orphans (not ``retain``) whose grace period has ended; returns their ids."""
        now = self.clock()
        expired = [
            row.id
            for row in await asyncio.to_thread(self.registry.list_snapshots)
            if row.orphaned_at is not None and not row.retain and row.orphaned_at + self.retention.grace_s <= now
        ]
        for snapshot_id in expired:
            try:
                await self.delete(snapshot_id, None)
                log.info("deleted orphaned snapshot %s (grace %.0fs ended)", snapshot_id, self.retention.grace_s)
            except (CryoboxError, OSError) as err:
                log.warning("deleting orphaned snapshot %s failed: %s", snapshot_id, err)
        return expired

    async def reconcile(self, live_sandbox_ids: set[str]) -> None:
        """At start: snapshots whose sandbox did not survive become orphans (their grace starts now); snapshot
        directories no row knows about (a crash between row delete and file delete) are removed."""
        now = self.clock()
        rows = await asyncio.to_thread(self.registry.list_snapshots)
        for row in rows:
            if row.orphaned_at is None and (row.sandbox_id is None or row.sandbox_id not in live_sandbox_ids):
                await asyncio.to_thread(functools.partial(self.registry.update_snapshot, row.id, orphaned_at=now))
        known = {row.id for row in rows}
        for snapshot_id in await asyncio.to_thread(self.store.ids):
            if snapshot_id not in known:
                log.info("removing snapshot files without a registry row: %s", snapshot_id)
                try:
                    await asyncio.to_thread(self.store.delete, snapshot_id)
                except OSError as err:
                    log.warning("removing %s failed: %s", snapshot_id, err)

    async def fork_tree(
        self, sandbox_id: str, workspace_id: str, *, count: int, metadata: dict[str, str]
    ) -> tuple[TreeResult, SnapshotRow]:
        tree = await self.forking.fork_tree(sandbox_id, workspace_id, count=count, metadata=metadata)
        try:
            row = await self._record(tree.snapshot, workspace_id, False, {"cryobox.tree_id": tree.tree_id})
        except BaseException:
            for child in tree.children:
                with contextlib.suppress(CryoboxError):
                    await self.forking.service.delete(child.id)
            raise
        return tree, row

    def tree_members(self, tree_id: str, workspace_id: str) -> list[Sandbox]:
        return [
            s
            for s in self.forking.service.all()
            if s.workspace_id == workspace_id and s.metadata.get("cryobox.tree_id") == tree_id
        ]

    def require_member(self, sandbox: Sandbox, tree_id: str) -> None:
        if sandbox.metadata.get("cryobox.tree_id") != tree_id:
            raise NotFound(
                f"sandbox {sandbox.id} is not a child of tree {tree_id}",
                details={"id": sandbox.id, "tree_id": tree_id},
            )
