"""Volumes that move between hosts through the object store, and volumes of a lost host.

A volume lives on one host (``volumes.host``). When a create needs it and that host is **draining**, the volume
moves, if no sandbox has it attached:

1. the move lease: one conditional update of the volume row (``move_token``; :meth:`~cryobox.registry.volumes.
   VolumeRecords.begin_move`), so two replicas never move it at once and no attachment is recorded meanwhile (a
   create asking for it gets 409 ``moving``); a lease older than :data:`LEASE_STALE_S` (its replica died) is
   taken over;
2. this registry claims ``volumes/<id>`` in the object store (so ``cryobox gc --store`` keeps it while the row
   exists), then the source agent stores the image (only the chunks the store lacks go up) and the row records
   the stored copy (``stored_sha256``: the manifest's sha256, ``stored_at``);
3. the target agent fetches it (the manifest checked against ``stored_sha256``, the image renamed into place
   only when whole);
4. ``host`` becomes the target and the lease is released, in one conditional update that only the lease's
   holder can make; then the source removes its copy (best effort: a copy left behind is a stray its agent
   reports).

A failure at any step releases the lease and removes what the target fetched; the volume stays where it was.

**With a sandbox that moves** (a drain): the drain hibernates the sandbox, stores its hibernation, then stores each
volume attached to it (:meth:`VolumeMover.store_held`: the agent stores a volume only while every holder is
hibernated, their locks held, so the copy is what the guest's memory has mounted). When the sandbox wakes on
another host, its volumes follow first (:meth:`VolumeMover.follow`): the same lease, taken although the sandbox
holds them (only that sandbox: a volume other sandboxes read stays, and the wake is 409), stored again from the
source when it is alive (only changed chunks go up: none), else fetched from the drain's copy, which is current —
the sandbox has been hibernated since; the attachments stay. The source's copies go once the sandbox's old host
forgot it (:meth:`VolumeMover.remove_copy`).

**Lost.** A volume whose host is down or lost (no heartbeat past the deadline) reads ``status: lost`` and a
create asking for it is 409 ``lost``, until the host comes back (then it is ``ready`` again, on that host, with
every write it had) or an operator **restores** it from its last stored copy (:meth:`VolumeMover.restore`):
the copy is fetched on a live host, the row names that host and the lost host's attachments are dropped. Writes
made after ``stored_at`` are lost; if the old host returns, its copy is stale and no longer the volume's: it is
removed when that agent registers (:meth:`VolumeMover.forget_strays`), as are copies left by a move whose source
could not be reached and images of volumes deleted meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ...agentapi import Agent
from ...agentapi.models_volumes import StoredVolume, VolumeFetch
from ...errors import CryoboxError, HostUnavailable, NotFound, StateError
from ...objstore.keys import volume_prefix
from ...registry import HIBERNATED, HIBERNATION_STORED, SandboxRow
from ...registry.volumes import VolumeRecords, VolumeRow
from .fleet import Fleet
from .ownership import StoreOwnership

log = logging.getLogger(__name__)

LEASE_STALE_S = 900.0
"""A move lease older than this belonged to a replica that died mid-move: another may take it over."""
HostState = str  # "up" | "draining" | "down"


def _stored_since(volume: VolumeRow, sandbox: SandboxRow) -> bool:
    """Whether the volume's stored copy was taken after ``sandbox`` hibernated (so it is what the guest's memory
    has mounted: the drain's copy)."""
    stamped = sandbox.hibernated_at
    return (
        volume.stored_sha256 is not None
        and volume.stored_at is not None
        and stamped is not None
        and (volume.stored_at >= stamped)
    )


@dataclass(frozen=True)
class Restored:
    """What a restore did: the volume's row now, the host it was lost on, and since when writes are lost."""

    row: VolumeRow
    lost_host: str
    stored_at: float


class VolumeMover:
    def __init__(
        self,
        records: VolumeRecords,
        fleet: Fleet,
        clock: Callable[[], float],
        owners: Callable[[], StoreOwnership | None] = lambda: None,
    ) -> None:
        self.records = records
        self.fleet = fleet
        self._clock = clock
        self._owners = owners
        self.after_store: Callable[[StoredVolume], Awaitable[None]] | None = None
        """Called after each store (tests, the bench)."""

    async def host_state(self, name: str) -> HostState:
        """``up``, ``draining`` (alive, takes nothing new) or ``down`` (down, lost, silent or unknown)."""
        try:
            row = await self.fleet.agent_row(name)  # cached for a second: a create with volumes reads no agent row
        except CryoboxError:
            return "down"
        if not self.fleet.is_alive(row):
            return "down"
        return "draining" if row.status == "draining" else "up"

    async def target_for(self, rows: list[VolumeRow]) -> str:
        """Where a create needing ``rows`` goes: the up host holding most of them (ties: fewest volumes held, then
        name), else the up host holding the fewest volumes. 503 when no host is up."""
        up = [row.name for row, _ in await self.fleet.live_agents() if row.status == "up"]
        if not up:
            raise HostUnavailable("no agent is up to hold the volumes", retry_after_s=2.0)
        held = await asyncio.to_thread(self.records.list_volumes)
        count = {name: 0 for name in up}
        for volume in held:
            if volume.host in count:
                count[volume.host] += 1
        mine = {name: sum(1 for r in rows if r.host == name) for name in up}
        return min(up, key=lambda name: (-mine[name], count[name], name))

    async def move(self, row: VolumeRow, target: str) -> VolumeRow:
        """Move the volume to ``target`` (see the module doc); its row afterwards."""
        now = self._clock()
        token = await asyncio.to_thread(self.records.begin_move, row.id, row.host, target, now, LEASE_STALE_S)
        try:
            source = await self.fleet.agent(row.host)  # 503: the source cannot store it
            stored = await self._store(row, source)
            row = await asyncio.to_thread(
                self.records.record_stored, row.id, token, stored.manifest_sha256, self._clock()
            )
            moved = await self._land(row, token, target, stored.manifest_sha256)
        except BaseException:
            await asyncio.to_thread(self.records.abort_move, row.id, token)
            raise
        await self.remove_copy(row.host, row.id)
        log.info("volume %s moved from %s to %s through the object store", row.id, row.host, target)
        return moved

    async def _land(self, row: VolumeRow, token: str, target: str, manifest_sha256: str) -> VolumeRow:
        """The last steps of a move under ``token``: ``target`` fetches the stored copy pinned by
        ``manifest_sha256``, then the row names it; on failure what ``target`` fetched goes (the caller releases
        the lease)."""
        agent = await self.fleet.agent(target)
        try:
            await agent.fetch_volume(VolumeFetch(volume_id=row.id, manifest_sha256=manifest_sha256))
            return await asyncio.to_thread(self.records.finish_move, row.id, token, target)
        except BaseException:
            await self.remove_copy(target, row.id)
            raise

    async def _store(self, row: VolumeRow, source: Agent) -> StoredVolume:
        owners = self._owners()
        if owners is not None:
            await asyncio.to_thread(owners.claim, volume_prefix(row.id))  # before anything is stored
        stored = await source.store_volume(row.id)
        if self.after_store is not None:
            await self.after_store(stored)
        return stored

    async def follow(self, sandbox: SandboxRow, target: str) -> list[tuple[str, str]]:
        """Move every volume attached to the hibernated ``sandbox`` to ``target``, where it is about to wake (see
        the module doc); returns the (host, volume id) copies left at the sources, to remove once the old host
        forgot the sandbox. 409 when another sandbox that is not a stored hibernation holds one, or one is on a
        host that is down without a copy stored since the sandbox hibernated."""
        left: list[tuple[str, str]] = []
        for attachment in await asyncio.to_thread(self.records.attachments_of, sandbox.id):
            row = await asyncio.to_thread(self.records.by_id, attachment.volume_id)
            if row.host != target:
                await self._carry(row, sandbox, target)
                left.append((row.host, row.id))
        return left

    async def placed_with(self, sandbox_id: str, home: str) -> str | None:
        """The host where the volumes of ``sandbox_id`` (hibernated on ``home``) already are, when a sibling that
        shares one took it away from ``home``: the sandbox must wake there (409 if they are on two hosts)."""
        rows = [
            await asyncio.to_thread(self.records.by_id, a.volume_id)
            for a in await asyncio.to_thread(self.records.attachments_of, sandbox_id)
        ]
        hosts = sorted({row.host for row in rows if row.host != home})
        if len(hosts) > 1:
            raise StateError(
                f"the volumes of sandbox {sandbox_id} are on {', '.join(hosts)}: it cannot wake with all of them",
                state="elsewhere",
                required="one host",
                details={"hosts": hosts},
            )
        return hosts[0] if hosts else None

    async def _portable_holders(self, row: VolumeRow) -> list[str]:
        """The holders of ``row`` that are stored hibernations (no VM writes it; each wakes where it goes)."""
        out = []
        for attachment in row.attachments:
            with contextlib.suppress(NotFound):
                held = await asyncio.to_thread(self.fleet.registry.get_sandbox, attachment.sandbox_id)
                if held.status == HIBERNATED and held.hibernation == HIBERNATION_STORED:
                    out.append(held.id)
        return out

    async def _carry(self, row: VolumeRow, sandbox: SandboxRow, target: str) -> VolumeRow:
        holders = {sandbox.id, *await self._portable_holders(row)}
        begin = functools.partial(
            self.records.begin_move, row.id, row.host, target, self._clock(), LEASE_STALE_S, holders=holders
        )
        token = await asyncio.to_thread(begin)
        try:
            if await self.host_state(row.host) != "down":
                stored = await self._store(row, await self.fleet.agent(row.host))
                sha = stored.manifest_sha256
                await asyncio.to_thread(self.records.record_stored, row.id, token, sha, self._clock())
            elif _stored_since(row, sandbox):
                sha = row.stored_sha256 or ""  # stored by the drain, after the sandbox hibernated
            else:
                raise StateError(
                    f"volume {row.name!r} of sandbox {sandbox.id} is lost: its host {row.host} is down and no copy "
                    "of it was stored since the sandbox hibernated",
                    state="lost",
                    required="ready",
                    details={"volume": row.name, "host": row.host, "stored_at": row.stored_at},
                )
            moved = await self._land(row, token, target, sha)
        except BaseException:
            await asyncio.to_thread(self.records.abort_move, row.id, token)
            raise
        log.info("volume %s followed sandbox %s from %s to %s", row.id, sandbox.id, row.host, target)
        return moved

    async def store_held(self, sandbox_id: str) -> None:
        """Store every volume attached to the hibernated sandbox ``sandbox_id`` where it is (a drain: the copies
        its wake elsewhere needs if the host is gone by then). A volume another sandbox of the host still runs
        with is left to that sandbox's turn in the drain (the agent stores only what no VM writes)."""
        for attachment in await asyncio.to_thread(self.records.attachments_of, sandbox_id):
            try:
                await self.store(await asyncio.to_thread(self.records.by_id, attachment.volume_id))
            except StateError as err:
                if err.state != "attached":
                    raise
                log.info("volume %s is stored with the last of its holders to drain: %s", attachment.volume_id, err)

    async def forget_strays(self, host: str) -> list[str]:
        """Remove the copies ``host`` holds that no row places there (an agent registering): of a volume deleted
        while it was away, of one that moved or was restored elsewhere meanwhile (a restored volume's old copy
        holds only the writes its restore gave up: the restore said so). A copy a move is fetching there stays."""
        try:
            held = [v.volume_id for v in await (await self.fleet.agent(host)).list_volumes()]
        except CryoboxError as err:  # an agent without a volume store, or gone again
            log.info("agent %s: its volume copies were not checked: %s", host, err.message)
            return []
        if not held:
            return []
        rows = {row.id: row for row in await asyncio.to_thread(self.records.list_volumes)}
        strays = [
            volume_id
            for volume_id in held
            if (row := rows.get(volume_id)) is None or (row.host != host and row.move_target != host)
        ]
        for volume_id in strays:
            await self.remove_copy(host, volume_id)
        if strays:
            log.warning("agent %s held %d volume copy(ies) placed elsewhere or deleted: removed", host, len(strays))
        return strays

    async def remove_copy(self, host: str, volume_id: str) -> None:
        try:
            await (await self.fleet.agent(host)).delete_volume(volume_id)
        except CryoboxError as err:
            log.warning("the copy of volume %s on %s was not removed: %s", volume_id, host, err)

    async def store(self, row: VolumeRow) -> VolumeRow:
        """Store the volume's image now (it must be detached) and record the copy; no lease (the host stays)."""
        stored = await self._store(row, await self.fleet.agent(row.host))
        return await asyncio.to_thread(self.records.record_stored, row.id, None, stored.manifest_sha256, self._clock())

    async def restore(self, row: VolumeRow) -> Restored:
        """Bring a lost volume back from its last stored copy on an up host (409 unless its host is down, or when
        it was never stored)."""
        if await self.host_state(row.host) != "down":
            raise StateError(
                f"volume {row.name!r} is not lost: its host {row.host} is up",
                state="ready",
                required="lost",
                details={"host": row.host},
            )
        if row.stored_sha256 is None or row.stored_at is None:
            raise StateError(
                f"volume {row.name!r} was never stored in the object store: there is nothing to restore it from; "
                f"it comes back when {row.host} does",
                state="lost",
                required="a stored copy",
                details={"host": row.host},
            )
        target = await self.target_for([])
        token = await asyncio.to_thread(
            self.records.begin_move, row.id, row.host, target, self._clock(), LEASE_STALE_S, attached_ok=True
        )
        try:
            await (await self.fleet.agent(target)).fetch_volume(
                VolumeFetch(volume_id=row.id, manifest_sha256=row.stored_sha256)
            )
            moved = await asyncio.to_thread(self.records.finish_move, row.id, token, target, detach=True)
        except BaseException:
            await asyncio.to_thread(self.records.abort_move, row.id, token)
            with contextlib.suppress(NotFound):
                await self.remove_copy(target, row.id)
            raise
        log.warning(
            "volume %s restored on %s from its copy stored at %.0f: writes on %s since then are lost",
            row.id,
            target,
            row.stored_at,
            row.host,
        )
        return Restored(moved, row.host, row.stored_at)
