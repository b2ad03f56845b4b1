"""The agent's snapshot operations: capture, copy to the object store, restore sources, trees, evidence.

A snapshot is captured into this host's snapshot store (durable on its disk, see :mod:`..snapshot.store`),
then copied to the object store (:meth:`SnapshotOps.store`, idempotent) so any agent can restore it: an agent
that holds the files restores from them (memory mapped from the hot copy), one that does not imports the
snapshot's small files from the store and pages its memory in through the memory server. The store's copy is
pinned in the registry: :meth:`SnapshotOps.store` returns the sha256 of the manifest it uploaded, and an import
checks the fetched manifest against the hash the control plane passes down (``SnapshotRef.manifest_sha256``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ...agentapi import models as am
from ...errors import CryoboxError, NotFound, ObjectNotFound
from ...objstore.keys import evidence_key, evidence_prefix, manifest_key, snapshot_prefix
from ...objstore.manifests import delete_published, recorded_manifest
from ...util.background import Background
from ..host.startup import Host
from ..publish.templates import import_snapshot, publish_snapshot
from ..sandbox.forking import ChildClones, ChildVolumes, SlotFactory
from ..sandbox.sandbox import Sandbox
from ..snapshot import evidence
from ..snapshot.store import SnapshotImage

log = logging.getLogger(__name__)


def snapshot_info(image: SnapshotImage, labels: dict[str, str] | None = None) -> am.SnapshotInfo:
    manifest = image.manifest
    return am.SnapshotInfo(
        id=image.id,
        template=image.template,
        generation=manifest.get("template_generation") or _generation_of(manifest),
        sandbox_id=manifest.get("sandbox_id"),
        parent_id=manifest.get("parent"),
        size_bytes=image.size_bytes,
        unique_bytes=image.unique_bytes,
        shared_bytes=image.shared_bytes,
        pause_ms=image.pause_ms,
        created_at=float(manifest["created_at"]),
        labels=dict(labels if labels is not None else manifest.get("labels") or {}),
        path=str(image.path),
    )


def _generation_of(manifest: dict[str, object]) -> str | None:
    generation = manifest.get("generation")
    return str(generation) if generation else None


class SnapshotOps:
    def __init__(self, host: Host, clock: Callable[[], float]) -> None:
        self.host = host
        self.clock = clock
        self._imports: dict[str, asyncio.Lock] = {}
        self._storing: dict[str, asyncio.Lock] = {}
        self.background = Background(name="snapshot-store")
        """Copies to the object store run at a lower CPU priority than captures (:mod:`cryobox.util.background`)."""

    def _load(self, snapshot_id: str) -> SnapshotImage:
        return self.host.snapshots.load(snapshot_id)

    async def take(self, sandbox_id: str, request: am.SnapshotRequest) -> am.SnapshotInfo:
        image = await self.host.forking.snapshot(
            sandbox_id, snapshot_id=request.snapshot_id, labels=dict(request.labels), quiesce=request.quiesce
        )
        return self._with_generation(image, dict(request.labels))

    def _with_generation(self, image: SnapshotImage, labels: dict[str, str] | None) -> am.SnapshotInfo:
        info = snapshot_info(image, labels)
        if info.generation is None:
            template = self.host.service.templates.get(image.template)
            if template is not None:
                info = info.model_copy(update={"generation": template.generation})
        return info

    async def store(self, snapshot_id: str) -> am.StoredSnapshot:
        """Copy a local snapshot to the object store (memory in chunks, manifest last); idempotent. Concurrent
        calls for one snapshot go one at a time, so all of them answer with the manifest that is in the store."""
        lock = self._storing.setdefault(snapshot_id, asyncio.Lock())
        try:
            async with lock:
                return await self._store(snapshot_id)
        finally:
            if not lock.locked():
                self._storing.pop(snapshot_id, None)

    async def _store(self, snapshot_id: str) -> am.StoredSnapshot:
        image = await asyncio.to_thread(self._load, snapshot_id)
        prefix = snapshot_prefix(snapshot_id)
        if image.manifest.get("memory_prefix") == prefix:  # imported from the store: it is there already
            sha = await asyncio.to_thread(recorded_manifest, image.path, f"{prefix}/manifest.json")
            return am.StoredSnapshot(id=snapshot_id, store=self.host.store.url, key=prefix, manifest_sha256=sha)
        template = self.host.service.template(image.template)
        published = await self.background.run(publish_snapshot, self.host.store, image, template)
        await self.background.run(self._store_evidence, image)
        return am.StoredSnapshot(
            id=snapshot_id, store=self.host.store.url, key=published.key, manifest_sha256=published.manifest_sha256
        )

    def _store_evidence(self, image: SnapshotImage) -> None:
        for entry in evidence.listing(image.path):
            name = str(entry["name"])
            self.host.store.put(evidence_key(image.id, name), evidence.read(image.path, name))

    async def restorable(self, ref: am.SnapshotRef) -> SnapshotImage:
        """The local files of a snapshot, imported from the object store first when this host has none."""
        if await asyncio.to_thread(self.host.snapshots.exists, ref.id):
            return await asyncio.to_thread(self._load, ref.id)
        if not ref.stored:
            raise NotFound(f"snapshot {ref.id} has no files on this host", details={"id": ref.id})
        lock = self._imports.setdefault(ref.id, asyncio.Lock())
        try:
            await self._import_once(ref, lock)
        finally:
            if not lock.locked():  # the last waiter out drops it: one lock per import under way, not per snapshot
                self._imports.pop(ref.id, None)
        return await asyncio.to_thread(self._load, ref.id)

    async def _import_once(self, ref: am.SnapshotRef, lock: asyncio.Lock) -> None:
        async with lock:  # concurrent restores of one snapshot import it once
            if not await asyncio.to_thread(self.host.snapshots.exists, ref.id):
                template = self.host.service.template(ref.template)
                try:
                    await asyncio.to_thread(
                        import_snapshot,
                        self.host.store,
                        ref.id,
                        self.host.snapshots.root,
                        template,
                        ref.manifest_sha256,
                    )
                except ObjectNotFound:
                    raise NotFound(f"snapshot {ref.id} is not in the object store", details={"id": ref.id}) from None
                await asyncio.to_thread(self._import_evidence, ref.id)
                log.info("snapshot %s imported from %s (memory paged from the store)", ref.id, self.host.store.url)

    def _import_evidence(self, snapshot_id: str) -> None:
        prefix = evidence_prefix(snapshot_id)
        path = self.host.snapshots.root / snapshot_id
        for key in self.host.store.list(prefix.rstrip("/")):  # listing matches whole segments
            with contextlib.suppress(CryoboxError):
                evidence.put(path, key[len(prefix) :], self.host.store.get(key))

    async def delete(self, snapshot_id: str, *, from_store: bool) -> None:
        await asyncio.to_thread(self.host.snapshots.delete, snapshot_id)
        if from_store:
            await asyncio.to_thread(delete_published, self.host.store, snapshot_prefix(snapshot_id))

    async def prune(self, keep: set[str]) -> list[str]:
        gone = [i for i in await asyncio.to_thread(self.host.snapshots.ids) if i not in keep]
        for snapshot_id in gone:
            log.info("removing snapshot files without a registry row: %s", snapshot_id)
            try:
                await asyncio.to_thread(self.host.snapshots.delete, snapshot_id)
            except OSError as err:
                log.warning("removing %s failed: %s", snapshot_id, err)
        return gone

    async def fork(
        self,
        sandbox_id: str,
        request: am.ForkRequest,
        slot: SlotFactory | None,
        volumes: ChildVolumes,
        clones: ChildClones,
    ) -> Sandbox:
        """A cold-booted child of the parent's disk, with its ``volumes`` and ``clones`` (by child id)."""
        child_id = request.child_id
        return await self.host.forking.fork(
            sandbox_id,
            metadata=dict(request.metadata),
            child_id=child_id,
            slot=slot,
            volumes=volumes.get(child_id, ()),
            clones=clones.get(child_id, ()),
        )

    async def fork_tree(
        self,
        sandbox_id: str,
        request: am.TreeRequest,
        info: Callable[[Sandbox], am.SandboxInfo],
        slot: SlotFactory | None = None,
        volumes: ChildVolumes | None = None,
        clones: ChildClones | None = None,
    ) -> am.TreeResult:
        """Snapshot the parent and restore the requested children here, each child in its own admission ``slot``
        (the snapshot takes none), with its ``volumes`` and ``clones`` (by child id)."""
        if not request.child_ids:  # only the snapshot: the children are placed on other agents
            image = await self.host.forking.snapshot(sandbox_id, snapshot_id=request.snapshot_id)
            return am.TreeResult(snapshot=self._with_generation(image, {"cryobox.tree_id": request.tree_id}))
        tree = await self.host.forking.fork_tree(
            sandbox_id,
            metadata=dict(request.metadata),
            snapshot_id=request.snapshot_id,
            child_ids=list(request.child_ids),
            tree_id=request.tree_id,
            slot=slot,
            volumes=volumes,
            clones=clones,
        )
        return am.TreeResult(
            snapshot=self._with_generation(tree.snapshot, {"cryobox.tree_id": request.tree_id}),
            children=[info(c) for c in tree.children],
            errors=[am.TreeChildError(child_id=request.child_ids[i], error=e) for i, e in tree.errors],
        )

    def _dir(self, snapshot_id: str) -> SnapshotImage:
        if not self.host.snapshots.exists(snapshot_id):
            raise NotFound(f"snapshot {snapshot_id} has no files on this host", details={"id": snapshot_id})
        return self._load(snapshot_id)

    async def evidence_list(self, snapshot_id: str) -> list[am.EvidenceEntry]:
        image = await asyncio.to_thread(self._dir, snapshot_id)
        entries = await asyncio.to_thread(evidence.listing, image.path)
        return [am.EvidenceEntry(name=str(e["name"]), size=int(str(e["size"]))) for e in entries]

    async def evidence_read(self, snapshot_id: str, name: str) -> bytes:
        image = await asyncio.to_thread(self._dir, snapshot_id)
        return await asyncio.to_thread(evidence.read, image.path, name)

    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int:
        image = await asyncio.to_thread(self._dir, snapshot_id)
        size = await asyncio.to_thread(evidence.put, image.path, name, data)
        if await asyncio.to_thread(self.host.store.exists, manifest_key(snapshot_prefix(snapshot_id))):
            key = evidence_key(snapshot_id, name)
            await asyncio.to_thread(self.host.store.put, key, data)  # keep the stored copy complete
        return size
