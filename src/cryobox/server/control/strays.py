"""Sandboxes an agent runs that the control plane never recorded: the agent made one (and its durable record)
but the control plane that asked died before it wrote the row, or the agent was killed after its record and
before its answer (a create, a fork, a tree child cut short). Nobody can reach or pay for them, so when an
agent's report names a sandbox with no row and no unexpired reservation, it is deleted on that agent (at
registration, and on every heartbeat: a dead replica's reservations expire after ``CRYOBOX_RESERVATION_TTL_S``)."""

from __future__ import annotations

import asyncio
import logging

from ...agentapi import Agent
from ...agentapi import models as am
from ...errors import CryoboxError
from ...registry import Registry
from ...registry.strays import unknown_sandboxes

log = logging.getLogger(__name__)


async def delete_strays(
    registry: Registry, name: str, agent: Agent, sandboxes: list[am.SandboxInfo], now: float
) -> list[str]:
    """Delete the sandboxes of an agent's report the registry does not know (:func:`unknown_sandboxes`)."""
    reported = [s.id for s in sandboxes]
    if not reported:
        return []
    adopted = [s.id for s in sandboxes if s.adopted]
    strays = await asyncio.to_thread(unknown_sandboxes, registry.database, reported, now, adopted)
    for sandbox_id in strays:
        try:
            await agent.delete(sandbox_id)
        except CryoboxError as err:
            log.warning("agent %s: could not delete unrecorded sandbox %s: %s", name, sandbox_id, err)
    if strays:
        log.warning("agent %s: deleted %d sandbox(es) without a row: %s", name, len(strays), ", ".join(strays))
    return strays
