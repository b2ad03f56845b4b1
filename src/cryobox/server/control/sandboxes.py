"""The control plane's sandbox operations: registry, placement and the host agents together.

The control plane decides *where* (placement with reservations) and *whether* (the caller's workspace, the
template's visibility); the agent holding a sandbox does everything else. It reaches agents only through the
typed interface (:mod:`cryobox.agentapi`). A sandbox row is written only after its agent answered (in the same
transaction that settles the reservation) and removed before the agent kills the VM on delete, so a crash
leaves at worst a row whose VM is gone (the agent's next registration reports that), never a VM no row knows
about for long. Every sandbox that comes to exist (create, restore, fork, tree child) or wakes asks the workspace's
quota first (:mod:`.quotas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace

from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError, HostUnavailable, InvalidArgument, NotFound, StateError, WorkspaceQuotaExceeded
from ...netpolicy import EgressPolicy
from ...registry import (
    HIBERNATED,
    HIBERNATION_LOCAL,
    HIBERNATION_STORED,
    QuotaRecords,
    Registry,
    ReservationRow,
    SandboxRow,
)
from ...util.steps import step
from ..mapping import live_row, row_for
from ..metrics import Metrics
from .builds import RecipeBuilds
from .counters import CounterGatherer, fleet_roster
from .createrequest import INHERIT, CreateRequest
from .fleet import Fleet
from .hibernations import HibernationControl
from .network import NetworkControl, reconcile
from .placement import Placement, PlacementRequest
from .quotas import QuotaGuard, check_ttl, ttl_for
from .snapshots import SnapshotControl
from .systemsandboxes import SystemSandboxes
from .templates import TemplateJobs
from .timeouts import OnTimeout, TimeoutActions, TimeoutReport
from .volumecontent import VolumeContent
from .volumeplace import place_moving_volumes
from .volumes import MountRequest, VolumeControl

log = logging.getLogger(__name__)
UNSET = object()  # "not given" in a PATCH, distinct from an explicit null
LIVE_STATES = ("starting", "running", "paused", "hibernated")
SNAPSHOT_LOCALITY_BONUS_MIB = 4096  # a local restore maps the hot copy; elsewhere it pages from the store


def new_sandbox_id() -> str:
    return f"sb-{secrets.token_hex(6)}"


class ControlPlane:
    def __init__(
        self,
        fleet: Fleet,
        registry: Registry,
        placement: Placement,
        metrics: Metrics,
        snapshots: SnapshotControl,
        templates: TemplateJobs,
        hibernations: HibernationControl | None = None,
        quotas: QuotaGuard | None = None,
    ) -> None:
        self.fleet = fleet
        self.registry = registry
        self.placement = placement
        self.metrics = metrics
        self.snapshots = snapshots
        self.templates = templates
        self.builds = RecipeBuilds(registry, templates, snapshots.objects, clock=fleet.clock)
        """Recipe builds of templates (context blobs, build records and logs): :mod:`.builds`."""
        self.hibernations = hibernations or HibernationControl(
            registry, fleet, placement, snapshots.objects, snapshots.owners
        )
        fleet.relocator = self.hibernations.relocate  # a stored hibernation wakes where there is room
        self.quotas = quotas or QuotaGuard(QuotaRecords(registry.database))  # defaults: CRYOBOX_QUOTA_* (env)
        # one guard for every path that makes or wakes a sandbox, snapshot or template
        fleet.waker = self._wake
        self.hibernations.quotas = snapshots.quotas = templates.quotas = self.quotas
        self._states: dict[str, int] = {}
        metrics.set_sandbox_state_provider(lambda: self._states)
        self.counters = CounterGatherer(fleet_roster(fleet))
        """The live agents' counters, gathered and appended to every scrape: :mod:`.counters`."""
        metrics.add_source(self.counters.exposition)
        self.network = NetworkControl(registry, fleet)
        """Network policies changed live, egress decisions: :mod:`.network`."""
        self.volumes = VolumeControl(registry, fleet, self.quotas, fleet.clock)
        """Named volumes and their attachments: :mod:`.volumes`."""
        self.hibernations.volumes = self.volumes.mover  # a drained sandbox's volumes follow it
        self.volume_content = VolumeContent(SystemSandboxes(self), fleet.clock)
        """A volume's files through a system sandbox: :mod:`.volumecontent`."""
        self.volumes.evict = self.volume_content.evict
        self.volumes.owners = snapshots.owners
        self.timeouts = TimeoutActions(
            registry,
            fleet,
            delete=lambda sandbox_id, host: self.delete(sandbox_id, None, host=host),
            hibernate=lambda sandbox_id: self.hibernate(sandbox_id, None),
            retention_s=snapshots.retention.paused_s,
            clock=fleet.clock,
        )
        """Timeout actions (kill or hibernate) and the paused retention: :mod:`.timeouts`."""
        snapshots.awake = self.awake

    # -- routing -------------------------------------------------------------------------------------------

    async def row(self, sandbox_id: str, workspace_id: str) -> SandboxRow:
        return await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)

    async def route(
        self, sandbox_id: str, workspace_id: str | None, *, wake: bool = True, explicit: bool = False
    ) -> tuple[SandboxRow, Agent]:
        """The sandbox's row and its agent (404 across workspaces; 409 ``lost`` when its agent is gone). With
        ``wake`` (a request that needs the guest) a hibernated sandbox is woken first, inside its quota — if its
        ``auto_wake`` allows, or the request is an ``explicit`` resume (409 otherwise)."""
        return await self.fleet.route(sandbox_id, workspace_id, wake=wake, explicit=explicit)

    async def agent_for(
        self, sandbox_id: str, workspace_id: str, *, wake: bool = True, explicit: bool = False
    ) -> Agent:
        return (await self.route(sandbox_id, workspace_id, wake=wake, explicit=explicit))[1]

    async def hibernate(self, sandbox_id: str, workspace_id: str | None, *, quota: bool = True) -> am.SandboxInfo:
        """Hibernate the sandbox (explicitly, or at its timeout) inside its workspace's ``hibernated`` quota
        (``quota=False``: putting back one that was hibernated a moment ago)."""
        row, agent = await self.route(sandbox_id, workspace_id, wake=False)
        admission = await self.quotas.admit_hibernation(row.workspace_id, sandbox_id) if quota else None
        try:
            info = await agent.hibernate(sandbox_id)
            await self.record_state(sandbox_id, info)
        finally:
            if admission is not None:
                admission.release()
        return info

    @contextlib.asynccontextmanager
    async def awake(self, sandbox_id: str, workspace_id: str | None) -> AsyncIterator[tuple[SandboxRow, Agent]]:
        """The sandbox awake for a snapshot or a fork: a hibernated one is woken (whatever its ``auto_wake``) and
        hibernated again afterwards, so it stays as its owner left it."""
        before = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)
        row, agent = await self.route(sandbox_id, workspace_id, wake=True, explicit=True)
        try:
            yield row, agent
        finally:
            if before.status == HIBERNATED:
                try:
                    await self.hibernate(sandbox_id, workspace_id, quota=False)
                except CryoboxError as err:  # it stays awake, its TTL running: nothing is lost
                    log.warning("sandbox %s could not go back to hibernation: %s", sandbox_id, err.message)

    async def _wake(self, row: SandboxRow, agent: Agent) -> SandboxRow:
        """Wake hibernated ``row`` on ``agent`` (the fleet's ``waker``): its vCPUs and memory count again."""
        with await self.quotas.admit(row.workspace_id, row.cpus, row.memory_mib, sandbox_ids=[row.id]):
            info = await reconcile(agent, row, await agent.wake(row.id))  # a policy changed while it slept
            await self.record_state(row.id, info)
        woken = live_row(row, info)
        if info.state != HIBERNATED:
            woken = replace(woken, hibernation=None, hibernation_generation=None, hibernation_manifest_sha256=None)
        return woken

    # -- create --------------------------------------------------------------------------------------------

    async def create(self, request: CreateRequest, timing: dict[str, float] | None = None) -> SandboxRow:
        """Place and restore a sandbox; ``timing`` (when given) receives each step's ms: ``ttl``, ``source`` (the
        template or snapshot), ``volumes``, ``admit``, ``reserve``, ``agent`` (the agent's share: the restore)
        and ``commit``."""
        row, _ = await self.create_mounted(request, timing)
        return row

    async def create_mounted(
        self, request: CreateRequest, timing: dict[str, float] | None = None
    ) -> tuple[SandboxRow, tuple[MountRequest, ...]]:
        """:meth:`create`, and the mounts the sandbox got (those asked for, or its snapshot's): what its view
        shows, without reading them back."""
        started = time.monotonic()
        with step(timing, "ttl"):
            ttl_s = await self.quotas.ttl(request.workspace_id, request.ttl_s, request.persistent)  # 400 first
        with step(timing, "source"):
            template, placement, ref, egress, mounts = await self._source(request)
        sandbox_id = new_sandbox_id()
        with step(timing, "volumes"):
            attached, volume_host = await self.volumes.claim(request.workspace_id, sandbox_id, mounts)
        movable = volume_host is not None and placement.only is None  # placed only by its volumes
        if volume_host is not None:  # a sandbox goes where its volumes are
            if placement.only is not None and placement.only != volume_host:
                await self.volumes.sandbox_gone(sandbox_id)
                raise StateError(
                    f"the snapshot is on {placement.only} and the volumes on {volume_host}",
                    state="elsewhere",
                    required="one host",
                )
            placement = replace(placement, only=volume_host, prefer=volume_host)
        spec = am.CreateSpec(
            sandbox_id=sandbox_id,
            template=template,
            workspace_id=request.workspace_id,
            from_snapshot=ref,
            metadata=request.metadata,
            env=request.env,
            ttl_s=ttl_s,
            persistent=request.persistent,
            egress=egress,
            volumes=attached,
        )
        try:
            with step(timing, "admit"):
                admission = await self.quotas.admit(
                    request.workspace_id, placement.cpus, placement.memory_mib, sandbox_ids=[sandbox_id]
                )
            with admission:
                ttl_s = ttl_for(admission.quota, request.ttl_s, request.persistent)  # the limits read just now
                if ttl_s != spec.ttl_s:  # they changed since this replica last read them
                    spec = replace(spec, ttl_s=ttl_s)
                try:
                    row = await self.place(placement, spec, timing, request.on_timeout)
                except HostUnavailable as full:  # its volumes' host is full: they move, if they can
                    if not movable:
                        raise
                    row = await place_moving_volumes(self, placement, spec, mounts, full, request.on_timeout)
        except (HostUnavailable, WorkspaceQuotaExceeded):
            await self.volumes.sandbox_gone(sandbox_id)
            self.metrics.observe_create("refused", "restore")
            raise
        except BaseException:
            await self.volumes.sandbox_gone(sandbox_id)
            self.metrics.observe_create("error", "restore")
            raise
        self.metrics.observe_create("ok", row.boot_mode, time.monotonic() - started)
        return row, mounts

    async def _source(
        self, request: CreateRequest
    ) -> tuple[str, PlacementRequest, am.SnapshotRef | None, EgressPolicy | None, tuple[MountRequest, ...]]:
        """What a create restores (a template, or a snapshot: 404 before anything is reserved) and where it may go:
        the template's name, the placement asked for, the snapshot's reference, the egress policy, the mounts."""
        ref: am.SnapshotRef | None = None
        mounts: tuple[MountRequest, ...] = request.volumes or ()
        egress = None if request.egress is INHERIT else request.egress
        if request.from_snapshot is not None:  # 404 before anything is reserved
            snap, ref = await self.snapshots.ref(request.from_snapshot, request.workspace_id)
            template = snap.template
            if request.egress is INHERIT:
                egress = snap.egress
            if request.volumes is None:  # the snapshot's mounts, re-attached (409 if one is written elsewhere)
                mounts = tuple(MountRequest(v["name"], v["path"], bool(v["read_only"])) for v in snap.volumes)
            cpus, memory = await self.templates.size(template)
            placement = PlacementRequest(
                memory_mib=memory,
                cpus=cpus,
                template=template,
                generation=snap.generation,
                local_keys=frozenset({snap.id}),
                prefer=snap.host if snap.location == "local" else None,
                only=snap.host if snap.location == "local" and snap.host else None,  # no other agent has its files
                locality_bonus_mib=SNAPSHOT_LOCALITY_BONUS_MIB,
            )
        else:
            tpl = await self.templates.require_ready(request.template, request.workspace_id)  # 404/409
            template = request.template
            placement = PlacementRequest(
                memory_mib=tpl.memory_mib,
                cpus=tpl.cpus,
                template=template,
                local_keys=frozenset({f"tpl-{template}-{tpl.generation}"}),
            )
        return template, placement, ref, egress, mounts

    async def place(
        self,
        placement: PlacementRequest,
        spec: am.CreateSpec,
        timing: dict[str, float] | None = None,
        on_timeout: OnTimeout | None = None,
    ) -> SandboxRow:
        """Reserve an agent, have it restore ``spec``, then commit the row with the reservation."""
        with step(timing, "reserve"):
            reservation = await self.placement.reserve(placement, spec.sandbox_id)
        try:
            agent = await self.fleet.agent(reservation.agent)
            with step(timing, "agent"):
                info = await agent.create(spec)
        except BaseException:
            with contextlib.suppress(CryoboxError):
                await self.placement.release(reservation)
            raise
        with step(timing, "commit"):
            return await self.commit(info, reservation.agent, agent, reservation, on_timeout)

    async def commit(
        self,
        info: am.SandboxInfo,
        host: str,
        agent: Agent,
        reservation: ReservationRow | None = None,
        on_timeout: OnTimeout | None = None,
    ) -> SandboxRow:
        """Write the row of a sandbox whose agent answered; if that fails the sandbox goes too."""
        row = row_for(info, host)
        if on_timeout is not None:
            row = replace(row, on_timeout=on_timeout.action, auto_wake=on_timeout.auto_wake)
        try:
            if reservation is not None:
                await self.placement.commit(reservation, row)
            else:
                await asyncio.to_thread(self.registry.add_sandbox, row)
        except BaseException:
            with contextlib.suppress(CryoboxError):
                await agent.delete(info.id)
            raise
        self.fleet.routes.put(row, self.fleet.routes.generation())  # its first exec is routed without a read
        return row

    # -- network -------------------------------------------------------------------------------------------

    async def set_network(self, sandbox_id: str, workspace_id: str, policy: EgressPolicy) -> SandboxRow:
        """Replace the sandbox's network policy (:meth:`.network.NetworkControl.set_network`)."""
        return await self.network.set_network(sandbox_id, workspace_id, policy)

    async def egress_log(self, sandbox_id: str, workspace_id: str, limit: int = 100) -> am.EgressLog:
        """The sandbox's newest egress decisions (:meth:`.network.NetworkControl.egress_log`)."""
        return await self.network.egress_log(sandbox_id, workspace_id, limit)

    # -- reads ---------------------------------------------------------------------------------------------

    async def get(self, sandbox_id: str, workspace_id: str) -> SandboxRow:
        row = await self.row(sandbox_id, workspace_id)
        if row.status not in LIVE_STATES:
            return row
        with contextlib.suppress(HostUnavailable, NotFound):
            return live_row(row, await (await self.fleet.agent(row.host)).get(sandbox_id))
        return row

    async def list_rows(self, workspace_id: str, status: str | None, metadata: dict[str, str]) -> list[SandboxRow]:
        rows = await asyncio.to_thread(self.registry.list_sandboxes, workspace_id, None, metadata)
        live: dict[str, am.SandboxInfo] = {}
        for host in sorted({r.host for r in rows if r.status in LIVE_STATES}):
            with contextlib.suppress(HostUnavailable):
                live.update({s.id: s for s in await (await self.fleet.agent(host)).list_sandboxes()})
        merged = [live_row(r, live[r.id]) if r.id in live else r for r in rows]
        return [r for r in merged if status is None or r.status == status]

    async def refresh_state_counts(self) -> None:
        rows = await asyncio.to_thread(self.registry.list_sandboxes)
        self._states = dict(Counter(r.status for r in rows))

    # -- changes -------------------------------------------------------------------------------------------

    async def delete(
        self, sandbox_id: str, workspace_id: str | None, keep_snapshots: bool = False, *, host: str | None = None
    ) -> None:
        """Row, then snapshots (deleted, or orphaned when ``retain``/``keep_snapshots``), then the VM (and a stored
        hibernation). With ``host``, only a sandbox whose row names that host (404 otherwise)."""
        row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)  # 404 across workspaces
        if host is not None and row.host != host:
            raise NotFound(f"sandbox {sandbox_id} is not on {host}", details={"sandbox_id": sandbox_id})
        await asyncio.to_thread(self.registry.delete_sandbox, sandbox_id)
        try:
            await self.snapshots.sandbox_gone(sandbox_id, keep_snapshots=keep_snapshots)
            if row.hibernation == HIBERNATION_STORED:
                await self.hibernations.forget_stored(sandbox_id)
            try:
                await (await self.fleet.agent(row.host)).delete(sandbox_id)
            except HostUnavailable as err:  # its agent reports it at its next registration; it has no row then
                log.warning("sandbox %s deleted while its agent is unreachable: %s", sandbox_id, err.message)
        finally:
            # detached (the volumes and their data stay) once its QEMU is gone, not before: until then the image
            # is still locked, and a create or content call let in by the registry would meet that lock
            await self.volumes.sandbox_gone(sandbox_id)

    async def record_state(self, sandbox_id: str, info: am.SandboxInfo) -> None:
        """Write the state an agent reported; a sandbox that became hibernated is stamped ``hibernated_at`` on the
        control plane's clock (what the paused retention counts from; staying hibernated keeps the stamp)."""

        def write() -> None:
            since: dict[str, float] = {}
            if info.state == HIBERNATED and self.registry.get_sandbox(sandbox_id).status != HIBERNATED:
                since["hibernated_at"] = self.fleet.clock()
            self.registry.update_sandbox(
                sandbox_id,
                status=info.state,
                vm_id=info.vm_id,
                guest_ip=info.guest_ip,
                hibernation=HIBERNATION_LOCAL if info.state == HIBERNATED else None,
                hibernation_generation=None,
                hibernation_manifest_sha256=None,
                **since,
            )

        with contextlib.suppress(NotFound):
            await asyncio.to_thread(write)

    async def lifecycle(self, sandbox_id: str, workspace_id: str) -> am.SandboxInfo:
        return await (await self.agent_for(sandbox_id, workspace_id, wake=False)).get(sandbox_id)

    async def update_lifecycle(
        self,
        sandbox_id: str,
        workspace_id: str,
        *,
        ttl_s: int | None | object,
        persistent: bool | None,
        on_timeout: str | None = None,
        auto_wake: bool | None = None,
    ) -> am.SandboxInfo:
        """Change the TTL and/or persistence (on the agent) and the timeout action and/or ``auto_wake`` (on the
        row); every value is checked before anything changes."""
        agent = await self.agent_for(sandbox_id, workspace_id, wake=False)
        if on_timeout is not None:
            OnTimeout(on_timeout)  # 400 for an unknown action, before anything changes
        if ttl_s is not UNSET and ttl_s is not None and not isinstance(ttl_s, int):
            raise InvalidArgument("ttl_seconds must be an integer or null")
        if isinstance(ttl_s, int):
            check_ttl(await self.quotas.limits(workspace_id), ttl_s)  # 400 above the workspace's maximum
        patch = am.LifecyclePatch(
            set_ttl=ttl_s is not UNSET,
            ttl_s=ttl_s if isinstance(ttl_s, int) else None,
            persistent=persistent,
        )
        info = await agent.set_lifecycle(sandbox_id, patch)
        await asyncio.to_thread(
            lambda: self.registry.update_sandbox(
                sandbox_id,
                ttl_s=info.ttl_s,
                persistent=info.persistent,
                expires_at=info.expires_at,
                last_active_at=info.last_active,
                **({"on_timeout": on_timeout} if on_timeout is not None else {}),
                **({"auto_wake": auto_wake} if auto_wake is not None else {}),
            )
        )
        return info

    async def reap_expired(self) -> TimeoutReport:
        """One pass of the timeout actions and the paused retention (:meth:`.timeouts.TimeoutActions.reap`)."""
        return await self.timeouts.reap()
