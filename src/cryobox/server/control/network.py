"""A sandbox's network policy, changed live, and its egress decisions.

The registry row is where a sandbox's policy lives (``SandboxRow.egress``; ``None``: nothing allowed): a create
writes the policy its agent applied, a change writes it once the agent accepted it, a snapshot records it
(``SnapshotRow.egress``, inherited by a create from the snapshot that names no network), and every wake applies
it: a wake elsewhere hands it to the new agent (``WakeSpec.egress``), a wake at home (:func:`reconcile`) changes
the woken sandbox's policy when its agent woke it with another one.

A hibernated sandbox's change is stored in the row even when its agent refuses it (``wrong_state``), no longer
holds the sandbox (a stored hibernation moved away) or cannot be reached: the policy takes effect at the wake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError, HostUnavailable, InvalidArgument, NotFound, StateError
from ...netpolicy import EgressPolicy
from ...registry import HIBERNATED, Registry, SandboxRow
from ..mapping import live_row
from .fleet import Fleet

log = logging.getLogger(__name__)
GONE_STATES = ("lost", "stopped", "error")
MAX_EGRESS_LIMIT = 1000
DEFAULT_EGRESS_LIMIT = 100


def in_force(policy: EgressPolicy | None) -> EgressPolicy:
    """The policy a sandbox has: ``None`` is the closed policy (nothing allowed)."""
    return policy if policy is not None else EgressPolicy()


def request_host(policy: EgressPolicy | None, port: int) -> str | None:
    """The ``Host`` the port proxy sends to the guest's port ``port``: the policy's ``mask_request_host`` with
    ``${PORT}`` replaced; ``None`` (the upstream's own address) when the policy masks nothing."""
    return policy.request_host(port) if policy is not None else None


async def reconcile(agent: Agent, row: SandboxRow, info: am.SandboxInfo) -> am.SandboxInfo:
    """After ``agent`` woke ``row``'s sandbox (``info``): give it the row's policy if it woke with another one (a
    change stored while it was hibernated). A refusal is logged, not raised: the sandbox is awake either way."""
    if in_force(info.egress) == in_force(row.egress):
        return info
    try:
        return await agent.set_network(row.id, am.NetworkUpdate(policy=in_force(row.egress)))
    except CryoboxError as err:
        log.warning("sandbox %s woke with another network policy than its row's: %s", row.id, err.message)
        return info


class NetworkControl:
    def __init__(self, registry: Registry, fleet: Fleet) -> None:
        self.registry = registry
        self.fleet = fleet

    async def _row(self, sandbox_id: str, workspace_id: str) -> SandboxRow:
        row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)  # 404 across workspaces
        if row.status in GONE_STATES:
            raise StateError(f"sandbox {sandbox_id} is {row.status}", state=row.status, required="running")
        return row

    async def set_network(self, sandbox_id: str, workspace_id: str, policy: EgressPolicy) -> SandboxRow:
        """Replace the sandbox's whole policy; its row says so once its agent took it (or, hibernated, at once).
        Never wakes the sandbox. :raises NotFound: no such sandbox in the workspace. :raises StateError: it is
        lost, stopped or failed."""
        row = await self._row(sandbox_id, workspace_id)
        update = am.NetworkUpdate(policy=policy)
        info: am.SandboxInfo | None = None
        if row.status == HIBERNATED:
            try:
                info = await (await self.fleet.agent(row.host)).set_network(sandbox_id, update)
            except (StateError, NotFound, HostUnavailable) as err:  # the wake applies the row's policy
                log.info("sandbox %s is hibernated; its new network policy applies at its wake (%s)", row.id, err.code)
        else:
            agent = await self.fleet.agent(row.host)
            try:
                info = await agent.set_network(sandbox_id, update)
            except StateError as err:
                if err.state != HIBERNATED:
                    raise
        egress = info.egress if info is not None else policy
        updated = await asyncio.to_thread(lambda: self.registry.update_sandbox(sandbox_id, egress=egress))
        return live_row(updated, info) if info is not None else updated

    async def policy(self, sandbox_id: str, workspace_id: str) -> EgressPolicy:
        """The policy in force (the row's; the closed policy when it has none)."""
        row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)
        return in_force(row.egress)

    async def egress_log(self, sandbox_id: str, workspace_id: str, limit: int = DEFAULT_EGRESS_LIMIT) -> am.EgressLog:
        """The sandbox's newest egress decisions (at most ``limit``, 0-1000), oldest first. Never wakes it: a
        hibernated sandbox whose agent no longer holds it (or is unreachable) has an empty log."""
        if not 0 <= limit <= MAX_EGRESS_LIMIT:
            raise InvalidArgument(f"limit must be 0-{MAX_EGRESS_LIMIT}, got {limit}", details={"field": "limit"})
        row = await self._row(sandbox_id, workspace_id)
        if row.status == HIBERNATED:
            with contextlib.suppress(NotFound, HostUnavailable):
                return await (await self.fleet.agent(row.host)).egress_log(sandbox_id, limit)
            return am.EgressLog(items=[])
        return await (await self.fleet.agent(row.host)).egress_log(sandbox_id, limit)
