"""Following one recipe build and settling its record: :class:`RecordWatch` writes the build's log lines (in
batches), its status (``waiting`` → ``building`` → ``ready`` | ``error``) and its heartbeat; :func:`settle_stale`
fails a record whose heartbeat stopped (the control plane running it died: a ``cryobox serve`` restart ends its
builds with it) so that the name can be built again.

The heartbeat is ``updated_at`` on the record, refreshed every :data:`HEARTBEAT_S` while the build task runs on this
control plane (:meth:`RecordWatch.heartbeat`, run by :class:`~.templates.TemplateJobs` alongside the build, so it
ends when the build does, cancelled or not). A started ``waiting``/``building`` record not refreshed for
:data:`STALE_AFTER_S` is, wherever it is read, persisted as ``error`` :data:`INTERRUPTED` at the step of its last
log line (``finalize`` when it logged none), by one compare-and-set in the registry, so with several replicas
exactly one settles it; that one also leaves the template row as a failed build would (a first build's row deleted,
a rebuild's previous ready template kept). The bound is far above the interval, so a replica whose clock runs
somewhat ahead of the builder's does not fail a live build; a late heartbeat never revives a failed record.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...agentapi import models as am
from ...errors import CryoboxError, NotFound
from ...registry.builds import ACTIVE, BuildLogEntry, BuildRecord

if TYPE_CHECKING:
    from .builds import RecipeBuilds

log = logging.getLogger(__name__)

FLUSH_LINES = 100
FLUSH_S = 0.5
HEARTBEAT_S = 10.0
"""How often the control plane running a build refreshes its record."""
STALE_AFTER_S = 60.0
"""A started build whose record was not refreshed for this long lost its control plane."""
INTERRUPTED = "interrupted: the control plane running it stopped"


async def drop_unbuilt_template(builds: RecipeBuilds, record: BuildRecord) -> None:
    """What a failed build leaves of its template: a row that never became ready (a first build's) is deleted; a
    ready one (the previous build's, serving while it rebuilt) is kept."""
    name = record.template
    try:
        row = await asyncio.to_thread(builds.registry.get_template, name)
    except NotFound:
        row = None
    if row is not None and row.status != "ready" and row.workspace_id == record.workspace_id:
        await asyncio.to_thread(builds.registry.delete_template, name)
    builds.templates.forget(name)


def is_stale(record: BuildRecord, now: float, stale_after_s: float) -> bool:
    """Whether ``record`` is a started build whose heartbeat stopped (a reservation, ``spec`` unset, never is)."""
    refreshed = record.updated_at if record.updated_at is not None else record.created_at
    return record.status in ACTIVE and record.spec is not None and now - refreshed > stale_after_s


async def settle_stale(builds: RecipeBuilds, record: BuildRecord) -> BuildRecord:
    """``record`` as it stands once a stopped heartbeat is accounted for (see the module's docstring)."""
    now = builds.clock()
    if not is_stale(record, now, builds.stale_after_s):
        return record
    failed = await asyncio.to_thread(
        builds.records.fail_stale, record.build_id, before=now - builds.stale_after_s, error=INTERRUPTED, now=now
    )
    if failed is None:  # refreshed meanwhile, finished, or another replica settled it
        return await asyncio.to_thread(builds.records.get, record.build_id)
    log.warning("build %s of %s: %s", record.build_id, record.template, INTERRUPTED)
    if not builds.templates.building(record.template):  # else this replica is rebuilding the row (a registration)
        await drop_unbuilt_template(builds, failed)
    return failed


class RecordWatch:
    """One build's record: its log lines (flushed in batches), its status, its heartbeat."""

    def __init__(self, builds: RecipeBuilds, record: BuildRecord, *, first: bool) -> None:
        self.builds, self.record, self.first = builds, record, first
        self.pending: list[BuildLogEntry] = []
        self.flushed_at = builds.clock()
        self.started = False
        self.error_logged = False
        self.lock = asyncio.Lock()
        self.timer: asyncio.Task[None] | None = None

    async def heartbeat(self) -> None:
        """Refresh the record every :attr:`RecipeBuilds.heartbeat_s` until cancelled or the record is settled."""
        records, build_id = self.builds.records, self.record.build_id
        while True:
            try:
                if not await asyncio.to_thread(records.touch, build_id, self.builds.clock()):
                    return
            except CryoboxError as err:
                log.warning("build %s: heartbeat not written: %s", build_id, err.message)
            await asyncio.sleep(self.builds.heartbeat_s)

    async def _flush(self) -> None:
        async with self.lock:  # one append at a time, so lines keep their order
            if self.pending:
                lines, self.pending = self.pending, []
                await asyncio.to_thread(self.builds.records.append_logs, self.record.build_id, lines)
            self.flushed_at = self.builds.clock()

    async def _flush_later(self) -> None:
        """Lines pended before a quiet spell (a long step printing nothing) are written within :data:`FLUSH_S`."""
        await asyncio.sleep(FLUSH_S)
        self.timer = None
        await self._flush()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _line(self, level: str, message: str, step: str | None) -> None:
        self.pending.append(BuildLogEntry(0, self.builds.clock(), level, message, step or ""))
        if self.timer is None:
            self.timer = asyncio.create_task(self._flush_later())

    async def event(self, event: am.BuildEvent) -> None:
        if not self.started:
            self.started = True
            await asyncio.to_thread(
                self.builds.records.update, self.record.build_id, status="building", updated_at=self.builds.clock()
            )
        if event.log is not None:
            self._line(event.level or "info", event.log, event.step)
        elif event.progress:
            self._line("info", event.progress, event.step)
        if event.error is not None:
            self._line("error", event.error, event.step)
            self.error_logged = True
        if len(self.pending) >= FLUSH_LINES or self.builds.clock() - self.flushed_at >= FLUSH_S:
            await self._flush()

    async def failed(self, error: str, step: str | None) -> None:
        if not self.error_logged:
            self._line("error", error, step)
        await self._flush()
        self._stop_timer()
        if self.first:  # a first build that failed leaves no template behind
            await drop_unbuilt_template(self.builds, self.record)
        now = self.builds.clock()
        await asyncio.to_thread(
            self.builds.records.update,
            self.record.build_id,
            status="error",
            error=error[:4000],
            error_step=step,
            finished_at=now,
            updated_at=now,
        )

    async def succeeded(self) -> None:
        await self._flush()
        self._stop_timer()
        now = self.builds.clock()
        await asyncio.to_thread(
            self.builds.records.update, self.record.build_id, status="ready", finished_at=now, updated_at=now
        )


__all__ = [
    "HEARTBEAT_S",
    "INTERRUPTED",
    "STALE_AFTER_S",
    "RecordWatch",
    "drop_unbuilt_template",
    "is_stale",
    "settle_stale",
]
