"""A sandbox's CPU and memory samples and its log, as its agent keeps them (:mod:`cryobox.agentapi.models_obs`).

Reading either never wakes a sandbox and never counts as activity. What the agent no longer holds (a hibernation
that moved to the object store, a sandbox still starting, one lost with its agent) has an empty history here,
not an error; a sandbox that runs on an agent that cannot be reached is ``503`` as any other request.
"""

from __future__ import annotations

import asyncio
import contextlib

from ...agentapi.models_obs import LogPage, LogQuery, MetricSeries
from ...errors import HostUnavailable, NotFound
from ...registry import HIBERNATED, SandboxRow
from .network import GONE_STATES
from .sandboxes import ControlPlane


async def _held(control: ControlPlane, sandbox_id: str, workspace_id: str) -> SandboxRow | None:
    """The sandbox's row (404 across workspaces), or ``None`` when no agent can answer for it."""
    row = await asyncio.to_thread(control.registry.get_sandbox, sandbox_id, workspace_id)
    return None if row.status in GONE_STATES else row


def _quiet(row: SandboxRow) -> tuple[type[Exception], ...]:
    """What a read of ``row``'s history shrugs off: an agent that does not hold it, and for a hibernated one an
    agent that is gone too."""
    return (NotFound, HostUnavailable) if row.status == HIBERNATED else (NotFound,)


async def sandbox_metrics(
    control: ControlPlane, sandbox_id: str, workspace_id: str, start: float | None = None, end: float | None = None
) -> MetricSeries:
    """The samples taken in ``[start, end]`` (epoch seconds, either open), oldest first."""
    empty = MetricSeries(sandbox_id=sandbox_id, interval_s=0.0, samples=[])
    row = await _held(control, sandbox_id, workspace_id)
    if row is None:
        return empty
    with contextlib.suppress(*_quiet(row)):
        return await (await control.fleet.agent(row.host)).sandbox_metrics(sandbox_id, start, end)
    return empty


async def sandbox_logs(control: ControlPlane, sandbox_id: str, workspace_id: str, query: LogQuery) -> LogPage:
    """A page of the sandbox's log (:class:`~cryobox.agentapi.models_obs.LogQuery`)."""
    empty = LogPage(entries=[], next_offset=query.offset or 0)
    row = await _held(control, sandbox_id, workspace_id)
    if row is None:
        return empty
    with contextlib.suppress(*_quiet(row)):
        return await (await control.fleet.agent(row.host)).sandbox_logs(sandbox_id, query)
    return empty
