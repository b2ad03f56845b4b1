"""The control plane's snapshot and retention operations (the registry and the agents holding the files).

Ordering rules (a crash at any step loses no record and leaks no files):

- take: files first (manifest written last), then the row; a failed row insert removes the files.
- delete: the row first, then the files; files without a row are removed by ``reconcile_files`` at start.
- a sandbox delete deletes its snapshots unless they are ``retain`` or the delete says ``keep_snapshots``;
  those that stay become orphans (``orphaned_at``), and orphans that are not ``retain`` are deleted by the
  sweep once their grace period has passed, never before.
- quota: a new snapshot (taken or imported) is refused with 429 ``quota_exceeded`` while the workspace's
  snapshots hold its ``snapshot_bytes`` quota or more (:mod:`.quotas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError, HostUnavailable, InvalidArgument, NotFound, ObjectNotFound, StateError
from ...netpolicy import EgressPolicy
from ...objstore.client import ObjectStore
from ...objstore.keys import evidence_key, evidence_prefix, manifest_key, snapshot_prefix
from ...objstore.manifests import delete_published
from ...registry import Registry, SandboxRow, SnapshotRow
from ...registry.volumes import VolumeRecords
from ..mapping import snapshot_row
from .fleet import Fleet
from .ownership import StoreOwnership
from .quotas import QuotaGuard

log = logging.getLogger(__name__)

Awake = Callable[[str, str | None], AbstractAsyncContextManager[tuple[SandboxRow, Agent]]]
"""A sandbox (id, workspace) held awake: its row and agent while the ``async with`` lasts."""
DEFAULT_GRACE_S = 7 * 24 * 3600.0
DEFAULT_SWEEP_INTERVAL_S = 15 * 60.0
DEFAULT_PAUSED_RETENTION_S = 30 * 24 * 3600.0


@dataclass(frozen=True)
class RetentionPolicy:
    """How long orphaned snapshots are kept, how often the sweep looks for expired ones, and how long a sandbox
    stays hibernated (paused) before it is deleted (:mod:`.timeouts`)."""

    grace_s: float = DEFAULT_GRACE_S
    sweep_interval_s: float = DEFAULT_SWEEP_INTERVAL_S
    paused_s: float = DEFAULT_PAUSED_RETENTION_S

    @classmethod
    def from_env(
        cls,
        grace_s: float | None = None,
        sweep_interval_s: float | None = None,
        env: dict[str, str] | None = None,
        *,
        paused_s: float | None = None,
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
            paused_s=pick(paused_s, "CRYOBOX_PAUSED_RETENTION_S", DEFAULT_PAUSED_RETENTION_S),
        )
        if policy.sweep_interval_s < 0.1:
            raise InvalidArgument("the orphan sweep interval must be at least 0.1 s")
        if policy.paused_s < 1:
            raise InvalidArgument("the paused retention must be at least 1 s")
        return policy


def snapshot_ref(row: SnapshotRow) -> am.SnapshotRef:
    """What an agent needs to restore the snapshot of ``row``, incl. the manifest hash it must check."""
    stored = row.location == "stored"
    return am.SnapshotRef(id=row.id, template=row.template, stored=stored, manifest_sha256=row.manifest_sha256)


def new_snapshot_id() -> str:
    return f"snap-{secrets.token_hex(6)}"


class SnapshotControl:
    """Snapshot rows and the agents holding the files. Every snapshot is copied to the object store after its
    capture (row ``location``: ``local`` -> ``stored``), so a restore by id works on any agent."""

    def __init__(
        self,
        registry: Registry,
        fleet: Fleet,
        clock: Callable[[], float],
        retention: RetentionPolicy,
        objects: ObjectStore | None = None,
        owners: StoreOwnership | None = None,
    ) -> None:
        self.registry = registry
        self.fleet = fleet
        self.clock = clock
        self.retention = retention
        self.objects = objects
        self.owners = owners
        """This registry's claims in the object store (:mod:`.ownership`); ``None``: nothing claimed."""
        self._storing: dict[str, asyncio.Task[None]] = {}
        self.quotas: QuotaGuard | None = None
        """The workspace quotas (set by the control plane); ``None``: unlimited."""
        self.awake: Awake = self._awake
        """The sandbox held awake for a capture (the control plane's: a hibernated one sleeps again after)."""

    @contextlib.asynccontextmanager
    async def _awake(self, sandbox_id: str, workspace_id: str | None) -> AsyncIterator[tuple[SandboxRow, Agent]]:
        yield await self.fleet.route(sandbox_id, workspace_id, wake=True, explicit=True)

    def _objects(self) -> ObjectStore:
        if self.objects is None:
            raise StateError("this control plane has no object store", state="no_store", required="store")
        return self.objects

    # -- durability in the store ---------------------------------------------------------------------------

    def store_later(self, row: SnapshotRow) -> None:
        """Copy the snapshot to the object store in the background (idempotent; one job per snapshot)."""
        if row.location == "stored" or row.id in self._storing:
            return
        task = asyncio.get_running_loop().create_task(self._store(row), name=f"store-{row.id}")
        self._storing[row.id] = task
        task.add_done_callback(lambda _: self._storing.pop(row.id, None))

    async def _store(self, row: SnapshotRow) -> None:
        try:
            stored = await self._store_on_agent(row)
            await asyncio.to_thread(self._mark_stored, row.id, stored)
            log.info("snapshot %s stored in the object store", row.id)
        except NotFound:
            log.info("snapshot %s went before it was stored", row.id)
        except (CryoboxError, OSError) as err:
            log.warning("storing snapshot %s failed (retried at the agent's next registration): %s", row.id, err)

    async def _store_on_agent(self, row: SnapshotRow) -> am.StoredSnapshot:
        """Claim the snapshot's prefix for this registry, then have its agent store it."""
        await self._claim(row.id)
        return await (await self.fleet.agent(row.host)).store_snapshot(row.id)

    async def _claim(self, snapshot_id: str) -> None:
        if self.owners is not None:
            await asyncio.to_thread(self.owners.claim, snapshot_prefix(snapshot_id))

    def _mark_stored(self, snapshot_id: str, stored: am.StoredSnapshot) -> SnapshotRow:
        """The row says ``stored``, with the sha256 of the manifest the agent uploaded (``None`` from an agent
        that predates pinning: imports of it trust the manifest as fetched, with a warning)."""
        if stored.manifest_sha256 is None:
            log.warning("snapshot %s was stored by an agent that returns no manifest hash: unpinned", snapshot_id)
        return self.registry.update_snapshot(snapshot_id, location="stored", manifest_sha256=stored.manifest_sha256)

    async def wait_stored(self, snapshot_id: str) -> None:
        task = self._storing.get(snapshot_id)
        if task is not None:
            await asyncio.shield(task)

    async def store_pending(self, host: str) -> None:
        """Resume copies of ``host``'s snapshots that are still only local (after a restart or an outage)."""
        for row in await asyncio.to_thread(functools.partial(self.registry.list_snapshots, host=host)):
            if row.location == "local":
                self.store_later(row)

    # -- snapshots -----------------------------------------------------------------------------------------

    async def ref(self, snapshot_id: str, workspace_id: str) -> tuple[SnapshotRow, am.SnapshotRef]:
        """The row of a snapshot the caller can see (404 otherwise) and what an agent needs to restore it."""
        row = await self.get(snapshot_id, workspace_id)
        return row, snapshot_ref(row)

    async def take(
        self, sandbox_id: str, workspace_id: str, *, labels: dict[str, str], retain: bool, quiesce: bool
    ) -> SnapshotRow:
        if self.quotas is not None:
            await self.quotas.admit_snapshot(workspace_id)
        async with self.awake(sandbox_id, workspace_id) as (sandbox, agent):  # a hibernated one wakes, then sleeps
            request = am.SnapshotRequest(snapshot_id=new_snapshot_id(), labels=labels, quiesce=quiesce)
            info = await agent.snapshot(sandbox_id, request)
            return await self.record(info, workspace_id, retain, labels, sandbox.host, sandbox.egress, sandbox_id)

    async def record(
        self,
        info: am.SnapshotInfo,
        workspace_id: str,
        retain: bool,
        labels: dict[str, str],
        host: str,
        egress: EgressPolicy | None = None,
        sandbox_id: str | None = None,
    ) -> SnapshotRow:
        """Write the row of a snapshot an agent took, with the network policy and the volume mounts (not their
        bytes) of its sandbox ``sandbox_id`` at that moment."""
        mounts = await asyncio.to_thread(self._mounts, sandbox_id) if sandbox_id is not None else []
        row = snapshot_row(info, workspace_id, retain, labels, host, egress, mounts)
        try:
            await asyncio.to_thread(self.registry.add_snapshot, row)
        except BaseException:
            with contextlib.suppress(CryoboxError):
                await (await self.fleet.agent(host)).delete_snapshot(info.id)
            raise
        self.store_later(row)
        return row

    def _mounts(self, sandbox_id: str) -> list[dict[str, Any]]:
        return [
            {"volume_id": a.volume_id, "name": name, "path": a.path, "read_only": a.read_only}
            for a, name in VolumeRecords(self.registry.database).mounts_of(sandbox_id)
        ]

    async def publish(self, snapshot_id: str, workspace_id: str) -> dict[str, str]:
        """Make sure the snapshot is in the object store (every snapshot gets there by itself; this waits)."""
        row = await self.get(snapshot_id, workspace_id)
        stored = await self._store_on_agent(row) if row.location != "stored" else None
        if stored is not None:
            await asyncio.to_thread(self._mark_stored, row.id, stored)
        store = stored.store if stored is not None else self._objects().url
        return {"id": snapshot_id, "store": store, "key": snapshot_prefix(row.id)}

    async def import_published(
        self, snapshot_id: str, workspace_id: str, *, labels: dict[str, str], retain: bool
    ) -> SnapshotRow:
        """Register a snapshot another installation put in this control plane's object store; any agent
        restores it (paging its memory in from the store). The row belongs to the caller's workspace."""
        objects = self._objects()
        try:
            data = await asyncio.to_thread(objects.get, manifest_key(snapshot_prefix(snapshot_id)))
        except ObjectNotFound:
            raise NotFound(
                f"snapshot {snapshot_id!r} is not published in {objects.url}", details={"id": snapshot_id}
            ) from None
        try:
            existing: SnapshotRow | None = await asyncio.to_thread(self.registry.get_snapshot, snapshot_id)
        except NotFound:
            existing = None
        if existing is not None and existing.workspace_id != workspace_id:
            # another tenant's snapshot: not importable, and its existence is not confirmed either
            raise NotFound(f"snapshot {snapshot_id!r} is not published in {objects.url}", details={"id": snapshot_id})
        if existing is not None:
            raise StateError(f"snapshot {snapshot_id} is already registered", state="exists", required="absent")
        manifest = json.loads(data)
        size_bytes = int(manifest.get("size_bytes") or 0)
        if self.quotas is not None:
            await self.quotas.admit_snapshot(workspace_id, size_bytes)
        row = SnapshotRow(
            id=snapshot_id,
            workspace_id=workspace_id,
            template=str(manifest.get("template")),
            path="",
            sandbox_id=None,
            parent_id=manifest.get("parent"),
            size_bytes=size_bytes,
            # a manifest from before layering has neither: all of it is the snapshot's own
            unique_bytes=int(manifest.get("unique_bytes", size_bytes) or 0),
            shared_bytes=int(manifest.get("shared_bytes") or 0),
            pause_ms=float((manifest.get("capture") or {}).get("pause_ms") or 0.0),
            labels={**(manifest.get("labels") or {}), **labels},
            retain=retain,
            created_at=float(manifest.get("created_at") or self.clock()),
            host="",
            location="stored",
            generation=manifest.get("template_generation"),
            # pinned as registered: every import of it refuses a manifest replaced in the store later
            manifest_sha256=hashlib.sha256(data).hexdigest(),
        )
        await asyncio.to_thread(self.registry.add_snapshot, row)
        await self._claim(row.id)  # this registry lists it now too: kept while either does
        return row

    async def _home(self, row: SnapshotRow) -> Agent | None:
        """The agent holding the snapshot's files, or ``None`` when only the store has them now."""
        if row.host:
            try:
                return await self.fleet.agent(row.host)
            except HostUnavailable:
                if row.location != "stored" or self.objects is None:
                    raise
        elif self.objects is None:
            raise HostUnavailable(f"no agent holds snapshot {row.id}", details={"id": row.id})
        return None

    async def evidence_list(self, snapshot_id: str, workspace_id: str) -> list[dict[str, object]]:
        row = await self.get(snapshot_id, workspace_id)
        agent = await self._home(row)
        if agent is not None:
            return [e.model_dump(exclude={"source"}) for e in await agent.evidence_list(row.id)]
        objects, prefix = self._objects(), evidence_prefix(row.id)

        def listing() -> list[dict[str, object]]:
            keys = sorted(objects.list(prefix.rstrip("/")))  # listing matches whole segments: no trailing "/"
            return [{"name": k[len(prefix) :], "size": objects.head(k).size} for k in keys]

        return await asyncio.to_thread(listing)

    async def evidence_read(self, snapshot_id: str, workspace_id: str, name: str) -> bytes:
        row = await self.get(snapshot_id, workspace_id)
        agent = await self._home(row)
        if agent is not None:
            return await agent.evidence_read(row.id, name)
        try:
            return await asyncio.to_thread(self._objects().get, evidence_key(row.id, name))
        except ObjectNotFound:
            raise NotFound(f"no evidence file {name!r}", details={"name": name}) from None

    async def evidence_put(self, snapshot_id: str, workspace_id: str, name: str, data: bytes) -> int:
        row = await self.get(snapshot_id, workspace_id)
        agent = await self._home(row)
        if agent is not None:
            return await agent.evidence_put(row.id, name, data)
        await asyncio.to_thread(self._objects().put, evidence_key(row.id, name), data)
        return len(data)

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
        """Row first, then every agent's copy (the home one and imports), then the stored objects. A step that
        fails is logged; what it leaves has no row and goes at the agent's next registration (pruned)."""
        row = await asyncio.to_thread(self.registry.get_snapshot, snapshot_id, workspace_id)
        await asyncio.to_thread(self.registry.delete_snapshot, snapshot_id)
        job = self._storing.pop(snapshot_id, None)
        if job is not None:
            job.cancel()
        for agent_row, agent in await self.fleet.live_agents():
            from_store = self.objects is None and agent_row.name == row.host
            try:
                await agent.delete_snapshot(snapshot_id, from_store=from_store)
            except CryoboxError as err:
                log.warning("deleting snapshot %s on %s failed: %s", snapshot_id, agent_row.name, err.message)
        if self.objects is not None:
            try:
                await asyncio.to_thread(delete_published, self.objects, snapshot_prefix(snapshot_id))
            except CryoboxError as err:
                log.warning("deleting the stored copy of snapshot %s failed: %s", snapshot_id, err.message)
            else:
                if self.owners is not None:
                    await asyncio.to_thread(self.owners.release, snapshot_prefix(snapshot_id))

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
                with contextlib.suppress(NotFound):
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

    async def reconcile(self, host: str, agent: Agent, live_sandbox_ids: set[str]) -> None:
        """When ``host`` registers: its snapshots whose sandbox did not survive become orphans (their grace
        starts now); its local copies no row knows about are removed; copies to the store resume."""
        now = self.clock()
        rows = await asyncio.to_thread(self.registry.list_snapshots)
        for row in rows:
            if row.host != host or row.orphaned_at is not None:
                continue
            if row.sandbox_id is None or row.sandbox_id not in live_sandbox_ids:
                await asyncio.to_thread(functools.partial(self.registry.update_snapshot, row.id, orphaned_at=now))
        await agent.prune_snapshots([row.id for row in rows])
        await self.store_pending(host)

    async def close(self) -> None:
        for task in list(self._storing.values()):
            task.cancel()
        await asyncio.gather(*self._storing.values(), return_exceptions=True)
