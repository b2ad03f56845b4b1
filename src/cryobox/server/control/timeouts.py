"""What a sandbox's TTL expiry does, and how long hibernated (paused) sandboxes are kept.

A sandbox's **timeout action** (:class:`OnTimeout`, on its registry row) is ``kill`` (delete it, as before) or
``hibernate`` (keep it: memory and disk captured, no RAM or CPU held). ``auto_wake`` says whether any request
for a hibernated sandbox wakes it (``True``, cryobox's default) or only an explicit resume/connect does (E2B's
default unless ``autoResume``); :meth:`~.fleet.Fleet.route` enforces it.

The agents say which of their sandboxes are idle past their TTL (``SandboxInfo.expired``; a hibernated sandbox's
TTL does not run, a busy one never expires); :meth:`TimeoutActions.reap` acts on each as its row says. A
hibernation the workspace's ``hibernated`` quota refuses leaves the sandbox running (nothing is lost; it still
counts as a sandbox) and is tried again on the next pass; it is logged once.

**Retention**: a sandbox hibernated for ``retention_s`` (the server's ``--paused-retention``, default 30 days;
``CRYOBOX_PAUSED_RETENTION_S``; :class:`~.snapshots.RetentionPolicy`) is deleted, counted from its row's
``hibernated_at``. A hibernated row without one (hibernated before revision 0013) is stamped when the sweep first
sees it. Every decision uses the injected clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ...errors import CryoboxError, InvalidArgument, NotFound, WorkspaceQuotaExceeded
from ...registry import HIBERNATED, ON_TIMEOUT_ACTIONS, ON_TIMEOUT_HIBERNATE, ON_TIMEOUT_KILL, Registry
from .fleet import Fleet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnTimeout:
    """A sandbox's timeout action and whether requests wake it once hibernated."""

    action: str = ON_TIMEOUT_KILL
    auto_wake: bool = True

    def __post_init__(self) -> None:
        if self.action not in ON_TIMEOUT_ACTIONS:
            raise InvalidArgument(
                f"on_timeout must be one of {', '.join(ON_TIMEOUT_ACTIONS)}, not {self.action!r}",
                details={"on_timeout": self.action},
            )


@dataclass
class TimeoutReport:
    """What one pass did (sandbox ids)."""

    killed: list[str] = field(default_factory=list)
    hibernated: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Expired ``hibernate`` sandboxes the ``hibernated`` quota kept running."""
    retired: list[str] = field(default_factory=list)
    """Hibernated past the retention: deleted."""


Delete = Callable[[str, str | None], Awaitable[None]]
"""Delete sandbox ``id`` (only while its row names host ``host``, when given)."""
Hibernate = Callable[[str], Awaitable[object]]
"""Hibernate sandbox ``id`` inside its workspace's ``hibernated`` quota."""


class TimeoutActions:
    def __init__(
        self,
        registry: Registry,
        fleet: Fleet,
        *,
        delete: Delete,
        hibernate: Hibernate,
        retention_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.registry = registry
        self.fleet = fleet
        self.retention_s = retention_s
        self._delete = delete
        self._hibernate = hibernate
        self._clock = clock
        self._refused: set[str] = set()  # logged once each, until it hibernates or goes

    async def reap(self) -> TimeoutReport:
        """One pass: the expired sandboxes of every live agent, then the retention of hibernated ones."""
        report = TimeoutReport()
        for agent_row, agent in await self.fleet.live_agents():
            try:
                infos = await agent.list_sandboxes()
            except CryoboxError as err:
                log.warning("reaper: listing agent %s failed: %s", agent_row.name, err.message)
                continue
            for info in infos:
                if info.expired:
                    await self._expire(info.id, agent_row.name, report)
        await self._retire(report)
        self._refused &= set(report.refused)
        return report

    async def _expire(self, sandbox_id: str, host: str, report: TimeoutReport) -> None:
        try:
            row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id)
        except NotFound:  # no row (a create being committed): not ours to reap
            return
        if row.host != host:  # a copy left behind by a move
            return
        try:
            if row.on_timeout == ON_TIMEOUT_HIBERNATE:
                if row.status != HIBERNATED:
                    await self._hibernate(sandbox_id)
                    report.hibernated.append(sandbox_id)
                    log.info("sandbox %s hibernated at its timeout (ttl %ss)", sandbox_id, row.ttl_s)
                return
            await self._delete(sandbox_id, host)
            report.killed.append(sandbox_id)
            log.info("sandbox %s expired (ttl %ss): deleted", sandbox_id, row.ttl_s)
        except WorkspaceQuotaExceeded as err:
            report.refused.append(sandbox_id)
            if sandbox_id not in self._refused:
                self._refused.add(sandbox_id)
                log.warning("sandbox %s stays running past its timeout: %s", sandbox_id, err.message)
        except NotFound:
            return
        except (CryoboxError, OSError) as err:
            log.warning("acting on the timeout of %s failed: %s", sandbox_id, err)

    async def _retire(self, report: TimeoutReport) -> None:
        now = self._clock()
        for row in await asyncio.to_thread(self.registry.list_sandboxes, None, HIBERNATED):
            if row.hibernated_at is None:
                await asyncio.to_thread(self._stamp, row.id, now)
                continue
            if now - row.hibernated_at < self.retention_s:
                continue
            try:
                await self._delete(row.id, None)
                report.retired.append(row.id)
                held = now - row.hibernated_at
                log.info("sandbox %s deleted: hibernated %.0f s (retention %.0f s)", row.id, held, self.retention_s)
            except NotFound:
                continue
            except (CryoboxError, OSError) as err:
                log.warning("deleting %s after its paused retention failed: %s", row.id, err)

    def _stamp(self, sandbox_id: str, now: float) -> None:
        try:
            self.registry.update_sandbox(sandbox_id, hibernated_at=now)
        except NotFound:
            pass
