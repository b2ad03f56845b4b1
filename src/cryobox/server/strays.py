"""Sandboxes an agent adopted that the control plane never recorded: the agent had made one durable (its record)
when it was killed, before the control plane saw the answer and wrote the row (a create, a fork or a tree child
cut short). Nobody can reach or pay for them, so at registration they are deleted on their agent."""

from __future__ import annotations

import asyncio
import logging

from ..agentapi import Agent
from ..agentapi import models as am
from ..errors import CryoboxError, NotFound
from ..registry import Registry

log = logging.getLogger(__name__)


async def delete_strays(registry: Registry, name: str, agent: Agent, hb: am.Heartbeat) -> list[str]:
    """Delete the adopted sandboxes of ``hb`` that have no row; returns their ids."""
    strays = []
    for sandbox in hb.sandboxes:
        if not sandbox.adopted:
            continue  # made by this agent process: its create may still be settling its row
        try:
            await asyncio.to_thread(registry.get_sandbox, sandbox.id)
        except NotFound:
            strays.append(sandbox.id)
    for sandbox_id in strays:
        try:
            await agent.delete(sandbox_id)
        except CryoboxError as err:
            log.warning("agent %s: could not delete unrecorded sandbox %s: %s", name, sandbox_id, err)
    if strays:
        log.warning("agent %s: deleted %d adopted sandbox(es) without a row: %s", name, len(strays), ", ".join(strays))
    return strays
