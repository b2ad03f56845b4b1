"""Fork, fork_tree and promote across the fleet.

- ``fork``: a child cold-booted from a copy of the parent's disk, so on the parent's agent (reserved there).
- ``fork_tree``: one reservation per child, placed with a strong preference for the parent's agent (its
  children restore from the capture's hot copy); children that do not fit there land on other agents, which
  restore the snapshot from the object store once it is stored. A child that gets no place or fails is
  reported in ``errors``; it never fails the tree.

Both ask the workspace's quota first (:mod:`.quotas`), a tree for all its children at once: a tree that does not
fit is refused whole (429 ``quota_exceeded``) with nothing captured, reserved or created. A tree's capture is a
snapshot, so it needs room in the ``snapshot_bytes`` quota too.

A parent with volumes: every child gets a copy-on-write clone of each read-write volume (a new volume named after
it) and the read-only ones read-only (:mod:`.forkvolumes`); the clones count against the volume quotas first, and
the children are placed only on the parent's agent, which holds the images. A tree's snapshot records the parent's
mounts, like any snapshot of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field

from ...agentapi import Agent
from ...agentapi import models as am
from ...agentapi.models_volumes import ChildVolume
from ...errors import CryoboxError, NotFound
from ...registry import ReservationRow, SandboxRow, SnapshotRow
from .forkvolumes import ForkVolumes, ParentMount
from .placement import PlacementRequest
from .sandboxes import ControlPlane, new_sandbox_id
from .snapshots import snapshot_ref

log = logging.getLogger(__name__)
MAX_TREE = 16
TREE_LOCALITY_BONUS_MIB = 4096


@dataclass
class TreeOutcome:
    tree_id: str
    snapshot: SnapshotRow
    children: list[SandboxRow] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)


class ForkControl:
    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self.volumes = ForkVolumes(control.volumes)

    async def _request(self, parent: SandboxRow, *, only: str | None = None) -> PlacementRequest:
        generation = None
        with contextlib.suppress(NotFound):
            agent = await asyncio.to_thread(self.control.registry.fleet.get_agent, parent.host)
            generation = (agent.capacity.get("templates_ready") or {}).get(parent.template)
        return PlacementRequest(
            memory_mib=parent.memory_mib,
            cpus=parent.cpus,
            template=parent.template,
            generation=generation,
            prefer=parent.host,
            only=only,
            locality_bonus_mib=TREE_LOCALITY_BONUS_MIB,
        )

    async def fork(self, sandbox_id: str, workspace_id: str, *, metadata: dict[str, str]) -> SandboxRow:
        async with self.control.awake(sandbox_id, workspace_id) as (parent, agent):  # a hibernated one sleeps again
            return await self._fork(parent, agent, workspace_id, metadata)

    async def _fork(self, parent: SandboxRow, agent: Agent, workspace_id: str, metadata: dict[str, str]) -> SandboxRow:
        sandbox_id = parent.id
        child_id = new_sandbox_id()
        mounts = await self.volumes.parent_mounts(parent.id)
        quotas = self.control.quotas
        with (
            await quotas.admit(workspace_id, parent.cpus, parent.memory_mib, sandbox_ids=[child_id]),
            await self.volumes.admit(workspace_id, mounts, [child_id]),
        ):
            request = await self._request(parent, only=parent.host)
            reservation = await self.control.placement.reserve(request, child_id)
            volumes: list[ChildVolume] = []
            try:
                volumes = await self.volumes.attach_child(workspace_id, child_id, mounts)
                info = await agent.fork(
                    sandbox_id, am.ForkRequest(child_id=child_id, metadata=metadata, volumes=volumes)
                )
            except BaseException:
                await self.volumes.child_gone(child_id, volumes)
                with contextlib.suppress(CryoboxError):
                    await self.control.placement.release(reservation)
                raise
            try:
                return await self.control.commit(info, parent.host, agent, reservation)
            except BaseException:  # the commit deleted the child
                await self.volumes.child_gone(child_id, volumes)
                raise

    async def fork_tree(
        self, sandbox_id: str, workspace_id: str, *, count: int, metadata: dict[str, str]
    ) -> TreeOutcome:
        child_ids = [new_sandbox_id() for _ in range(count)]
        quotas = self.control.quotas
        await quotas.admit_snapshot(workspace_id)  # the tree's capture is a snapshot of the workspace
        async with self.control.awake(sandbox_id, workspace_id) as (parent, agent):  # a hibernated one sleeps again
            mounts = await self.volumes.parent_mounts(parent.id)
            with (
                await quotas.admit(workspace_id, parent.cpus, parent.memory_mib, count, sandbox_ids=child_ids),
                await self.volumes.admit(workspace_id, mounts, child_ids),
            ):
                return await self._tree(parent, agent, workspace_id, child_ids, metadata, mounts)

    async def _tree(
        self,
        parent: SandboxRow,
        agent: Agent,
        workspace_id: str,
        child_ids: list[str],
        metadata: dict[str, str],
        mounts: list[ParentMount],
    ) -> TreeOutcome:
        sandbox_id = parent.id
        tree_id = f"tree-{secrets.token_hex(6)}"
        request = await self._request(parent, only=parent.host if mounts else None)  # the images are there
        placed: list[tuple[int, str, ReservationRow]] = []
        errors: list[tuple[int, str]] = []
        for index, child_id in enumerate(child_ids):  # decided in full before any restore starts
            try:
                placed.append((index, child_id, await self.control.placement.reserve(request, child_id)))
            except CryoboxError as err:
                errors.append((index, err.message))
        volumes = await self._child_volumes(workspace_id, mounts, placed, errors)
        local = [p for p in placed if p[2].agent == parent.host]
        remote = [p for p in placed if p[2].agent != parent.host]
        try:
            tree = await agent.fork_tree(
                sandbox_id,
                am.TreeRequest(
                    snapshot_id=f"snap-{secrets.token_hex(6)}",
                    child_ids=[child_id for _, child_id, _ in local],
                    metadata=metadata,
                    tree_id=tree_id,
                    volumes=volumes,
                ),
            )
        except BaseException:
            for _, child_id, reservation in placed:
                await self.volumes.child_gone(child_id, volumes.get(child_id, []))
                with contextlib.suppress(CryoboxError):
                    await self.control.placement.release(reservation)
            raise
        snapshot = await self.control.snapshots.record(
            tree.snapshot, workspace_id, False, {"cryobox.tree_id": tree_id}, parent.host, parent.egress, parent.id
        )
        outcome = TreeOutcome(tree_id=tree_id, snapshot=snapshot, errors=errors)
        made = {c.id: c for c in tree.children}
        failed = {e.child_id: e.error for e in tree.errors}
        results: dict[int, SandboxRow | str] = {}
        for index, child_id, reservation in local:
            if child_id in made:
                results[index] = await self._commit(made[child_id], parent.host, reservation)
            else:
                results[index] = failed.get(child_id, "the child was not created")
                with contextlib.suppress(CryoboxError):
                    await self.control.placement.release(reservation)
            if isinstance(results[index], str):
                await self.volumes.child_gone(child_id, volumes.get(child_id, []))
        if remote:
            child_meta = {**metadata, "cryobox.tree_id": tree_id, "cryobox.parent_id": parent.id}
            remote_results = await asyncio.gather(  # the parent's policy, as its row has it
                *(self._remote_child(snapshot, parent, child_id, r, child_meta) for _, child_id, r in remote)
            )
            for (index, _, _), result in zip(remote, remote_results, strict=True):
                results[index] = result
        for index in sorted(results):
            result = results[index]
            if isinstance(result, str):
                outcome.errors.append((index, result))
            else:
                outcome.children.append(result)
        outcome.errors.sort()
        return outcome

    async def _child_volumes(
        self,
        workspace_id: str,
        mounts: list[ParentMount],
        placed: list[tuple[int, str, ReservationRow]],
        errors: list[tuple[int, str]],
    ) -> dict[str, list[ChildVolume]]:
        """Each placed child's volumes, written before the agent is asked; a child whose volumes cannot be written
        (a clone name taken) is an error of the tree and gives its place back."""
        volumes: dict[str, list[ChildVolume]] = {}
        if not mounts:
            return volumes
        for entry in list(placed):
            index, child_id, reservation = entry
            try:
                volumes[child_id] = await self.volumes.attach_child(workspace_id, child_id, mounts)
            except CryoboxError as err:
                errors.append((index, err.message))
                placed.remove(entry)
                with contextlib.suppress(CryoboxError):
                    await self.control.placement.release(reservation)
        return volumes

    async def _commit(self, info: am.SandboxInfo, host: str, reservation: ReservationRow) -> SandboxRow | str:
        try:
            return await self.control.commit(info, host, await self.control.fleet.agent(host), reservation)
        except CryoboxError as err:
            return err.message

    async def _remote_child(
        self,
        snapshot: SnapshotRow,
        parent: SandboxRow,
        child_id: str,
        reservation: ReservationRow,
        metadata: dict[str, str],
    ) -> SandboxRow | str:
        """A child on another agent: it restores the tree's snapshot from the object store."""
        try:
            await self.control.snapshots.wait_stored(snapshot.id)
            stored = await self.control.snapshots.get(snapshot.id, parent.workspace_id)
            if stored.location != "stored":
                raise NotFound(f"snapshot {snapshot.id} could not be stored for another agent")
            agent = await self.control.fleet.agent(reservation.agent)
            info = await agent.create(
                am.CreateSpec(
                    sandbox_id=child_id,
                    template=parent.template,
                    workspace_id=parent.workspace_id,
                    from_snapshot=snapshot_ref(stored),
                    metadata=metadata,
                    env=parent.env,
                    egress=parent.egress,
                )
            )
        except CryoboxError as err:
            with contextlib.suppress(CryoboxError):
                await self.control.placement.release(reservation)
            log.warning("fork_tree child %s on %s failed: %s", child_id, reservation.agent, err.message)
            return err.message
        return await self._commit(info, reservation.agent, reservation)

    async def tree_members(self, tree_id: str, workspace_id: str) -> list[SandboxRow]:
        return await asyncio.to_thread(
            self.control.registry.list_sandboxes, workspace_id, None, {"cryobox.tree_id": tree_id}
        )
