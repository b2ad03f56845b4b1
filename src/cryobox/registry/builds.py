"""Recipe builds in the registry (``template_builds``, ``template_build_logs``, ``template_files``; revision 0010).

A build row outlives its build (and, after a failed first build, its template); its log lines are numbered from 0
and capped at :data:`MAX_LOG_LINES` per build, the cut marked by one last line. ``template_files`` maps a
client's own hash of its files (E2B's ``filesHash``) to the context blob (SHA-256 of the bytes) uploaded for it, per
workspace. Every method is synchronous and runs one short transaction, like :class:`~.repo.Registry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import delete, func, select

from ..errors import NotFound
from . import models as m
from .db import Database

MAX_LOG_LINES = 10_000
BUILD_STATUSES = ("waiting", "building", "ready", "error")


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
        """Set ``status``, ``finished_at``, ``error``, ``error_step``, ``tags``, ``cpus``, ``memory_mib``, ``spec``."""
        allowed = {"status", "finished_at", "error", "error_step", "tags", "cpus", "memory_mib", "spec"}
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


__all__ = ["BUILD_STATUSES", "MAX_LOG_LINES", "BuildLogEntry", "BuildRecord", "BuildRecords"]
