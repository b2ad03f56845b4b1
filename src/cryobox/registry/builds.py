"""Recipe builds in the registry (``template_builds``, ``template_build_logs``, ``template_files``; revisions 0010,
0011).

A build row outlives its build (and, after a failed first build, its template); its log lines are numbered from 0
and capped at :data:`MAX_LOG_LINES` per build, the cut marked by one last line. ``updated_at`` is the heartbeat of
the control plane running the build (:meth:`BuildRecords.touch`); :meth:`BuildRecords.fail_stale` fails a record
whose heartbeat stopped, once, whichever replica asks first. ``template_files`` maps a
client's own hash of its files (E2B's ``filesHash``) to the context blob (SHA-256 of the bytes) uploaded for it, per
workspace. Every method is synchronous and runs one short transaction, like :class:`~.repo.Registry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import delete, func, select, update

from ..errors import NotFound
from . import models as m
from .db import Database

MAX_LOG_LINES = 10_000
BUILD_STATUSES = ("waiting", "building", "ready", "error")
ACTIVE = ("waiting", "building")
LEVEL_RANK = {"debug": 0, "info": 1, "warn": 2, "error": 3}


@dataclass(frozen=True)
class BuildRecord:
    build_id: str
    template: str
    workspace_id: str
    status: str
    """``waiting`` | ``building`` | ``ready`` | ``error``."""
    created_at: float
    finished_at: float | None = None
    error: str | None = None
    error_step: str | None = None
    tags: tuple[str, ...] = ()
    cpus: int = 1
    memory_mib: int = 512
    spec: dict[str, Any] | None = None
    """The :class:`~cryobox.agentapi.models_templates.BuildSpec` the build ran, as JSON."""
    updated_at: float | None = None
    """Last refreshed (its heartbeat while it runs; any change); ``None`` on a new record: ``created_at``."""


@dataclass(frozen=True)
class BuildLogEntry:
    offset: int
    timestamp: float
    level: str
    message: str
    step: str = ""


def _record(row: m.TemplateBuild) -> BuildRecord:
    return BuildRecord(
        build_id=row.id,
        template=row.template,
        workspace_id=row.workspace_id,
        status=row.status,
        created_at=row.created_at,
        finished_at=row.finished_at,
        error=row.error,
        error_step=row.error_step,
        tags=tuple(row.tags or ()),
        cpus=row.cpus,
        memory_mib=row.memory_mib,
        spec=row.spec,
        updated_at=row.updated_at,
    )


class BuildRecords:
    def __init__(self, database: Database) -> None:
        self._db = database

    def add(self, record: BuildRecord) -> None:
        with self._db.session(what=f"build {record.build_id!r}") as s:
            s.add(
                m.TemplateBuild(
                    id=record.build_id,
                    workspace_id=record.workspace_id,
                    template=record.template,
                    status=record.status,
                    created_at=record.created_at,
                    finished_at=record.finished_at,
                    error=record.error,
                    error_step=record.error_step,
                    tags=list(record.tags),
                    cpus=record.cpus,
                    memory_mib=record.memory_mib,
                    spec=record.spec,
                    log_lines=0,
                    log_truncated=False,
                    updated_at=record.updated_at if record.updated_at is not None else record.created_at,
                )
            )

    def get(self, build_id: str, workspace_id: str | None = None) -> BuildRecord:
        """The build; ``NotFound`` when there is none (or it belongs to another workspace than ``workspace_id``)."""
        with self._db.session(write=False) as s:
            row = s.get(m.TemplateBuild, build_id)
            if row is None or (workspace_id is not None and row.workspace_id != workspace_id):
                raise NotFound(f"build {build_id!r} not found", details={"build_id": build_id})
            return _record(row)

    def update(self, build_id: str, **changes: Any) -> BuildRecord:
        """Set ``status``, ``finished_at``, ``error``, ``error_step``, ``tags``, ``cpus``, ``memory_mib``, ``spec``,
        ``updated_at``."""
        allowed = {"status", "finished_at", "error", "error_step", "tags", "cpus", "memory_mib", "spec", "updated_at"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        with self._db.session(what=f"build {build_id!r}") as s:
            row = s.get(m.TemplateBuild, build_id)
            if row is None:
                raise NotFound(f"build {build_id!r} not found", details={"build_id": build_id})
            for key, value in changes.items():
                setattr(row, key, list(value) if key == "tags" else value)
            return _record(row)

    def of_template(self, workspace_id: str, template: str) -> list[BuildRecord]:
        """The template's builds in this workspace, oldest first."""
        with self._db.session(write=False) as s:
            rows = s.scalars(
                select(m.TemplateBuild)
                .where(m.TemplateBuild.workspace_id == workspace_id, m.TemplateBuild.template == template)
                .order_by(m.TemplateBuild.created_at, m.TemplateBuild.id)
            ).all()
            return [_record(r) for r in rows]

    def recent(self, workspace_id: str, limit: int = 100) -> list[BuildRecord]:
        """The workspace's builds of every template, newest first, at most ``limit``."""
        with self._db.session(write=False) as s:
            rows = s.scalars(
                select(m.TemplateBuild)
                .where(m.TemplateBuild.workspace_id == workspace_id)
                .order_by(m.TemplateBuild.created_at.desc(), m.TemplateBuild.id)
                .limit(max(0, limit))
            ).all()
            return [_record(r) for r in rows]

    def latest(self, workspace_id: str, template: str) -> BuildRecord | None:
        builds = self.of_template(workspace_id, template)
        return builds[-1] if builds else None

    def active(self, workspace_id: str) -> list[BuildRecord]:
        """The workspace's ``waiting``/``building`` builds."""
        with self._db.session(write=False) as s:
            rows = s.scalars(
                select(m.TemplateBuild).where(
                    m.TemplateBuild.workspace_id == workspace_id, m.TemplateBuild.status.in_(ACTIVE)
                )
            ).all()
            return [_record(r) for r in rows]

    # -- heartbeats ------------------------------------------------------------------------------------------

    def touch(self, build_id: str, now: float) -> bool:
        """Refresh a running build's ``updated_at``; ``False`` when it is no longer ``waiting``/``building`` (e.g.
        another replica failed it as stale: a late heartbeat never revives it)."""
        with self._db.session(what=f"build {build_id!r}") as s:
            done = s.execute(
                update(m.TemplateBuild)
                .where(m.TemplateBuild.id == build_id, m.TemplateBuild.status.in_(ACTIVE))
                .values(updated_at=now)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(done, "rowcount", 0))

    def fail_stale(self, build_id: str, *, before: float, error: str, now: float) -> BuildRecord | None:
        """Fail a started (``spec`` set) ``waiting``/``building`` build last refreshed before ``before``: status
        ``error``, ``error``, ``error_step`` = the step of its last log line (``finalize`` when it logged none).
        One compare-and-set, so of several replicas reading it at once exactly one gets the record back (and
        settles its template); the others, and any call on a fresh or finished build, get ``None``."""
        with self._db.session(what=f"build {build_id!r}") as s:
            row = s.get(m.TemplateBuild, build_id)
            if row is None or row.spec is None:  # a reservation: no build runs yet (its spec is set at start)
                return None
            last = s.scalars(
                select(m.TemplateBuildLog.step)
                .where(m.TemplateBuildLog.build_id == build_id, m.TemplateBuildLog.step != "")
                .order_by(m.TemplateBuildLog.seq.desc())
                .limit(1)
            ).first()
            done = s.execute(
                update(m.TemplateBuild)
                .where(
                    m.TemplateBuild.id == build_id,
                    m.TemplateBuild.status.in_(ACTIVE),
                    m.TemplateBuild.updated_at < before,
                )
                .values(status="error", error=error, error_step=last or "finalize", finished_at=now, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if not getattr(done, "rowcount", 0):
                return None
            s.refresh(row)
            return _record(row)

    # -- logs ------------------------------------------------------------------------------------------------

    def append_logs(self, build_id: str, entries: Sequence[BuildLogEntry], *, limit: int = MAX_LOG_LINES) -> int:
        """Append ``entries`` (their offsets are assigned here); past ``limit`` lines one marker line is kept and
        the rest dropped. Returns how many lines the build has."""
        with self._db.session(what=f"build {build_id!r} logs") as s:
            row = s.get(m.TemplateBuild, build_id)
            if row is None:
                raise NotFound(f"build {build_id!r} not found", details={"build_id": build_id})
            for entry in entries:
                if row.log_truncated:
                    break
                last = row.log_lines >= limit
                if last:
                    entry = replace(entry, level="warn", message=f"log truncated after {limit} lines", step=entry.step)
                    row.log_truncated = True
                s.add(
                    m.TemplateBuildLog(
                        build_id=build_id,
                        seq=row.log_lines,
                        timestamp=entry.timestamp,
                        level=entry.level,
                        message=entry.message,
                        step=entry.step,
                    )
                )
                row.log_lines += 1
            return row.log_lines

    def logs(self, build_id: str, offset: int, limit: int, level: str | None = None) -> list[BuildLogEntry]:
        """Up to ``limit`` lines from ``offset`` on (``level``: only lines of that level)."""
        with self._db.session(write=False) as s:
            query = select(m.TemplateBuildLog).where(
                m.TemplateBuildLog.build_id == build_id, m.TemplateBuildLog.seq >= offset
            )
            if level is not None:
                query = query.where(m.TemplateBuildLog.level == level)
            rows = s.scalars(query.order_by(m.TemplateBuildLog.seq).limit(limit)).all()
            return [BuildLogEntry(r.seq, r.timestamp, r.level, r.message, r.step) for r in rows]

    def logs_by_time(
        self,
        build_id: str,
        *,
        cursor: float | None,
        newest_first: bool,
        limit: int,
        min_level: str | None = None,
    ) -> list[BuildLogEntry]:
        """Up to ``limit`` lines from ``cursor`` (a timestamp, inclusive) on, oldest first, or back from it, newest
        first; ``min_level``: only lines at least that severe (``debug`` < ``info`` < ``warn`` < ``error``)."""
        with self._db.session(write=False) as s:
            query = select(m.TemplateBuildLog).where(m.TemplateBuildLog.build_id == build_id)
            if cursor is not None:
                at = m.TemplateBuildLog.timestamp
                query = query.where(at <= cursor if newest_first else at >= cursor)
            if min_level is not None:
                levels = [name for name, rank in LEVEL_RANK.items() if rank >= LEVEL_RANK[min_level]]
                query = query.where(m.TemplateBuildLog.level.in_(levels))
            order = m.TemplateBuildLog.seq.desc() if newest_first else m.TemplateBuildLog.seq
            rows = s.scalars(query.order_by(order).limit(max(0, limit))).all()
            return [BuildLogEntry(r.seq, r.timestamp, r.level, r.message, r.step) for r in rows]

    def log_count(self, build_id: str) -> int:
        with self._db.session(write=False) as s:
            count = s.scalar(select(func.count()).where(m.TemplateBuildLog.build_id == build_id))
            return int(count or 0)

    # -- uploaded files ----------------------------------------------------------------------------------------

    def record_file(self, workspace_id: str, files_hash: str, blob_sha256: str, template: str, now: float) -> None:
        with self._db.session(what=f"files {files_hash!r}") as s:
            row = s.get(m.TemplateFile, (workspace_id, files_hash))
            if row is None:
                s.add(
                    m.TemplateFile(
                        workspace_id=workspace_id,
                        files_hash=files_hash,
                        blob_sha256=blob_sha256,
                        template=template,
                        created_at=now,
                    )
                )
            else:
                row.blob_sha256, row.template, row.created_at = blob_sha256, template, now

    def file_blob(self, workspace_id: str, files_hash: str) -> str | None:
        """The blob uploaded for ``files_hash`` in this workspace, if any."""
        with self._db.session(write=False) as s:
            row = s.get(m.TemplateFile, (workspace_id, files_hash))
            return None if row is None else row.blob_sha256

    def forget_blobs(self, blobs: Sequence[str]) -> None:
        """Drop every mapping onto these blobs (their objects are being deleted)."""
        if not blobs:
            return
        with self._db.session(what="template files") as s:
            s.execute(delete(m.TemplateFile).where(m.TemplateFile.blob_sha256.in_(list(blobs))))


__all__ = ["ACTIVE", "BUILD_STATUSES", "LEVEL_RANK", "MAX_LOG_LINES", "BuildLogEntry", "BuildRecord", "BuildRecords"]
