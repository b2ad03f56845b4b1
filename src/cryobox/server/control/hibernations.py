"""Drain, and hibernations that move between agents (the object store carries them).

**Drain** (:meth:`HibernationControl.drain`): the agent becomes ``draining`` (placement skips it, its heartbeats
keep it so), then each of its sandboxes is hibernated there and its image copied to the object store
(``hibernations/<id>/…``, the snapshot format); its row then says ``hibernation: stored`` with the template
generation the image sits on and the sha256 of the manifest the agent uploaded (``hibernation_manifest_sha256``:
the agent that wakes it refuses any other manifest, ``WakeSpec.manifest_sha256``). Idempotent and resumable: a
sandbox already stored is reported ``already``; one a crashed drain left hibernated but not stored is stored now
(both agent calls are idempotent).

**Wake elsewhere** (:meth:`HibernationControl.relocate`, the fleet's ``relocator``: every request resolves its
agent through :meth:`Fleet.route <cryobox.server.control.fleet.Fleet.route>`): a stored hibernation whose host is
draining, down or no longer holds it is placed like a create (reservation, the template generation it needs),
its volumes follow it there (:meth:`VolumeMover.follow <.volumemoves.VolumeMover.follow>`; a drain stored them
after the hibernation), the chosen agent imports and wakes it as the same sandbox (``Agent.wake_stored``), and
the row's host changes in the transaction that settles the reservation, only if the row still names the old host
and the stored image (of two requests racing, one wins; the other's copy is deleted unless it is the winner's).
Then the stored objects are deleted and the old agent, if reachable, forgets its copy (the row names the new host
first, so that delete cannot touch the new one), and its copies of the volumes that followed go too. An old
agent that was unreachable forgets it when it registers again (:meth:`agent_registered`). While the old host is
draining and alive, its copy is hibernated and stored again first (idempotent), so a wake there during the drain
is not lost. Such a wake asks the workspace's quota first (:mod:`.quotas`: its vCPUs and memory count again).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field

from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError, HostUnavailable, NotFound, StateError
from ...objstore.client import ObjectStore
from ...objstore.keys import hibernation_prefix
from ...objstore.manifests import delete_published
from ...registry import (
    AGENT_DRAINING,
    AGENT_UP,
    HIBERNATED,
    HIBERNATION_STORED,
    AgentRow,
    MoveRecords,
    Registry,
    SandboxRow,
)
from .fleet import Fleet
from .ownership import StoreOwnership
from .placement import Placement, PlacementRequest
from .quotas import QuotaGuard
from .volumemoves import VolumeMover

log = logging.getLogger(__name__)
DRAINABLE = ("running", "paused", HIBERNATED)


def portable(row: SandboxRow) -> bool:
    """Hibernated with its image in the object store: any agent serving its generation can wake it."""
    return row.status == HIBERNATED and row.hibernation == HIBERNATION_STORED


def wake_spec(row: SandboxRow) -> am.WakeSpec:
    return am.WakeSpec(
        sandbox_id=row.id,
        template=row.template,
        workspace_id=row.workspace_id,
        created_at=row.created_at,
        instance_id=row.instance_id or "",
        metadata=dict(row.metadata),
        env=dict(row.env),
        ttl_s=row.ttl_s,
        persistent=row.persistent,
        egress=row.egress,
        from_snapshot=row.from_snapshot,
        boot_mode="cold" if row.boot_mode == "cold" else "restore",
        manifest_sha256=row.hibernation_manifest_sha256,
    )


@dataclass(frozen=True)
class Drained:
    id: str
    seconds: float
    """Hibernate + copy to the store, on the agent (0 when it was stored already)."""
    already: bool = False


@dataclass(frozen=True)
class DrainFailure:
    id: str
    code: str
    error: str


@dataclass
class DrainReport:
    agent: str
    status: str
    drained: list[Drained] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(id, status) of rows with nothing to drain (``lost``, ``stopped``, ...)."""
    errors: list[DrainFailure] = field(default_factory=list)
    seconds: float = 0.0


class HibernationControl:
    def __init__(
        self,
        registry: Registry,
        fleet: Fleet,
        placement: Placement,
        objects: ObjectStore | None,
        owners: StoreOwnership | None = None,
    ) -> None:
        self.registry = registry
        self.fleet = fleet
        self.placement = placement
        self.objects = objects
        self.owners = owners
        """This registry's claims in the object store (:mod:`.ownership`); ``None``: nothing claimed."""
        self.moves = MoveRecords(registry.database, registry.sealer)
        self._moving: dict[str, asyncio.Lock] = {}
        self._draining: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[SandboxRow]] = set()
        self.quotas: QuotaGuard | None = None
        """The workspace quotas (set by the control plane); ``None``: unlimited."""
        self.volumes: VolumeMover | None = None
        """Moves a sandbox's volumes with it (set by the control plane); ``None``: no volumes."""

    # -- drain -------------------------------------------------------------------------------------------------

    async def drain(self, name: str) -> DrainReport:
        """Mark ``name`` draining and make every sandbox on it portable (see the module docstring)."""
        lock = self._draining.setdefault(name, asyncio.Lock())
        async with lock:  # one drain of an agent at a time per replica (another replica's is harmless too)
            started = time.monotonic()
            await asyncio.to_thread(self.registry.fleet.set_agent_status, name, AGENT_DRAINING)  # 404: no such agent
            self.fleet.forget_row(name)
            report = DrainReport(agent=name, status=AGENT_DRAINING)
            rows = await asyncio.to_thread(functools.partial(self.registry.list_sandboxes, host=name))
            agent: Agent | None = None
            unreachable: CryoboxError | None = None
            try:
                agent = await self.fleet.agent(name)
            except HostUnavailable as err:
                unreachable = err
            for row in rows:
                if portable(row):
                    report.drained.append(Drained(row.id, 0.0, already=True))
                elif row.status not in DRAINABLE:
                    report.skipped.append((row.id, row.status))
                elif agent is None:
                    assert unreachable is not None
                    report.errors.append(DrainFailure(row.id, unreachable.code, unreachable.message))
                else:
                    one = time.monotonic()
                    try:
                        await self._drain_one(agent, name, row)
                    except CryoboxError as err:
                        log.warning("drain of %s: sandbox %s: %s", name, row.id, err.message)
                        report.errors.append(DrainFailure(row.id, err.code, err.message))
                        continue
                    report.drained.append(Drained(row.id, round(time.monotonic() - one, 3)))
            report.seconds = round(time.monotonic() - started, 3)
        log.info(
            "agent %s drained: %d sandbox(es) in the store, %d failed, %.1f s",
            name,
            len(report.drained),
            len(report.errors),
            report.seconds,
        )
        return report

    async def _drain_one(self, agent: Agent, host: str, row: SandboxRow) -> None:
        info = await agent.hibernate(row.id)
        if not await asyncio.to_thread(self.moves.hibernated, row.id, host, info.egress, self.fleet.clock()):
            raise NotFound(f"sandbox {row.id} went during the drain", details={"id": row.id})
        stored = await self._store(agent, row.id)
        if self.volumes is not None:  # its volumes' copies, before it is portable (its host may be gone by its wake)
            await self.volumes.store_held(row.id)
        if not await asyncio.to_thread(self.moves.stored, row.id, host, stored.generation, stored.manifest_sha256):
            raise StateError(
                f"sandbox {row.id} woke (or went) during the drain; drain again",
                state="running",
                required=HIBERNATED,
                details={"id": row.id},
            )

    async def undrain(self, name: str) -> AgentRow:
        """Let placement use a draining agent again (its stored hibernations stay portable until woken)."""
        row = await asyncio.to_thread(self.registry.fleet.get_agent, name)  # 404: no such agent
        if row.status == AGENT_DRAINING:
            row = await asyncio.to_thread(self.registry.fleet.set_agent_status, name, AGENT_UP)
            self.fleet.forget_row(name)
        return row

    # -- wake elsewhere ----------------------------------------------------------------------------------------

    async def relocate(self, row: SandboxRow) -> SandboxRow:
        """The row of where the portable sandbox ``row`` is to be used: its own host when that is up and holds
        it, otherwise another agent that has just woken it (see the module docstring)."""
        # a move, once started, finishes even if the request that started it goes away (no half-woken copies)
        task = asyncio.get_running_loop().create_task(self._locked_relocate(row.id), name=f"relocate-{row.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _locked_relocate(self, sandbox_id: str) -> SandboxRow:
        lock = self._moving.setdefault(sandbox_id, asyncio.Lock())
        try:
            async with lock:  # requests to one sandbox on this replica wait for one move
                return await self._relocate(sandbox_id)
        finally:
            if not lock.locked():
                self._moving.pop(sandbox_id, None)

    async def _relocate(self, sandbox_id: str) -> SandboxRow:
        row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id)
        if not portable(row):  # moved (or woken at home) by the request before us
            return row
        home = await self._reachable(row.host)
        if home is not None and home[0] == AGENT_UP and await self._volumes_left(row):
            home = None  # a sibling took a volume they share elsewhere: its stored image wakes there
        if home is not None:
            status, agent = home
            try:
                if status == AGENT_UP:
                    await agent.get(row.id)
                    return row  # its host is up and holds it: it wakes there
                # draining: a request may have woken it there since the drain; capture what it is now
                await agent.hibernate(row.id)
                stored = await self._store(agent, row.id)
            except (NotFound, HostUnavailable):
                pass  # the host lacks it (or cannot be reached): the stored image is the sandbox
            else:  # what is stored now may be a newer image: its manifest is the one to pin
                sha = stored.manifest_sha256
                await asyncio.to_thread(self.moves.stored, row.id, row.host, stored.generation, sha)
                row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id)
                if not portable(row):
                    return row
        return await self._wake_elsewhere(row)

    async def _volumes_left(self, row: SandboxRow) -> bool:
        """Whether a sibling sharing a volume with ``row`` took it to another host (``row`` must wake there)."""
        return self.volumes is not None and await self.volumes.placed_with(row.id, row.host) is not None

    async def _reachable(self, name: str) -> tuple[str, Agent] | None:
        try:
            agent = await self.fleet.agent(name)
            status = (await asyncio.to_thread(self.registry.fleet.get_agent, name)).status
        except (HostUnavailable, NotFound):
            return None
        return status, agent

    async def _wake_elsewhere(self, row: SandboxRow) -> SandboxRow:
        if self.quotas is None:
            return await self._place_and_wake(row)
        with await self.quotas.admit(row.workspace_id, row.cpus, row.memory_mib, sandbox_ids=[row.id]):
            return await self._place_and_wake(row)

    async def _place_and_wake(self, row: SandboxRow) -> SandboxRow:
        pinned = await self.volumes.placed_with(row.id, row.host) if self.volumes is not None else None
        request = PlacementRequest(  # where a sibling took a volume they share, if one did
            memory_mib=row.memory_mib,
            cpus=row.cpus,
            template=row.template,
            generation=row.hibernation_generation,
            only=pinned,
        )
        reservation = await self.placement.reserve(request, row.id)
        target = reservation.agent
        started = time.monotonic()
        carried: list[tuple[str, str]] = []
        try:
            agent = await self.fleet.agent(target)
            if self.volumes is not None:  # its volumes first: the guest wakes with them mounted
                carried = await self.volumes.follow(row, target)
            info = await agent.wake_stored(wake_spec(row))
        except BaseException as err:
            with contextlib.suppress(CryoboxError):
                await self.placement.release(reservation)
            if isinstance(err, NotFound):  # no stored image (any more): moved by another replica meanwhile?
                return await self._after_missing_image(row)
            raise
        changes = {
            "status": info.state,
            "vm_id": info.vm_id,
            "guest_ip": info.guest_ip,
            "expires_at": info.expires_at,
            "last_active_at": info.last_active,
        }
        try:
            moved = await asyncio.to_thread(
                functools.partial(
                    self.moves.move, reservation.id, row.id, from_host=row.host, to_host=target, changes=changes
                )
            )
        except BaseException:
            await self._undo(reservation.id, agent, row.id, keep=target == row.host)
            raise
        if moved is None:  # another request moved it (or it was deleted) meanwhile
            try:
                current = await asyncio.to_thread(self.registry.get_sandbox, row.id)
            except NotFound:
                await self._undo(reservation.id, agent, row.id, keep=False)
                raise
            await self._undo(reservation.id, agent, row.id, keep=current.host == target)
            return current
        log.info("sandbox %s woke on %s (was on %s) in %.1f s", row.id, target, row.host, time.monotonic() - started)
        await self.forget_stored(row.id)
        if target != row.host:
            await self._forget_on(row.host, row.id)
        if self.volumes is not None:
            for host, volume_id in carried:  # after the old host forgot the sandbox that held them
                await self.volumes.remove_copy(host, volume_id)
        return moved

    async def _after_missing_image(self, row: SandboxRow) -> SandboxRow:
        current = await asyncio.to_thread(self.registry.get_sandbox, row.id)
        if portable(current) and current.host == row.host:
            raise StateError(
                f"the stored hibernation of sandbox {row.id} is missing from the object store",
                state="hibernated",
                required="a stored image",
                details={"id": row.id},
            )
        return current

    async def _undo(self, reservation_id: str, agent: Agent, sandbox_id: str, *, keep: bool) -> None:
        with contextlib.suppress(CryoboxError):
            await asyncio.to_thread(self.registry.fleet.release, reservation_id)
        if not keep:
            with contextlib.suppress(CryoboxError):
                await agent.delete(sandbox_id)

    async def _forget_on(self, host: str, sandbox_id: str) -> None:
        try:
            await (await self.fleet.agent(host)).delete(sandbox_id)
        except CryoboxError as err:  # it forgets it when it registers again (agent_registered)
            log.info("agent %s keeps a copy of moved sandbox %s for now: %s", host, sandbox_id, err.message)

    async def _store(self, agent: Agent, sandbox_id: str) -> am.StoredHibernation:
        """Claim the hibernation's prefix for this registry, then have ``agent`` store it."""
        if self.owners is not None:
            await asyncio.to_thread(self.owners.claim, hibernation_prefix(sandbox_id))
        return await agent.store_hibernation(sandbox_id)

    async def forget_stored(self, sandbox_id: str) -> None:
        """Delete the sandbox's stored hibernation (if this control plane has the object store)."""
        if self.objects is None:
            return
        try:
            await asyncio.to_thread(delete_published, self.objects, hibernation_prefix(sandbox_id))
        except CryoboxError as err:
            log.warning("deleting the stored hibernation of %s failed: %s", sandbox_id, err.message)
        else:
            if self.owners is not None:
                await asyncio.to_thread(self.owners.release, hibernation_prefix(sandbox_id))

    async def close(self) -> None:
        """Wait for moves under way (a stopping control plane does not leave half-woken copies)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def agent_registered(self, name: str, hb: am.Heartbeat) -> None:
        """A registering agent forgets the copies of sandboxes that moved to another host while it was away."""
        stray = await asyncio.to_thread(self.moves.elsewhere, name, [s.id for s in hb.sandboxes])
        if stray:
            log.info("agent %s holds %d sandbox(es) that moved elsewhere: forgetting them", name, len(stray))
        for sandbox_id in stray:
            await self._forget_on(name, sandbox_id)
