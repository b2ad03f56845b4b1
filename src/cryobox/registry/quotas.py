"""Per-workspace quotas in the registry: a workspace's own limits (``workspace_quotas``, revision 0006) and what
it uses now (its sandbox, snapshot and custom-template rows), read in one transaction.

The limits themselves, their defaults and the admission logic live in :mod:`cryobox.server.control.quotas`; this module
only stores and reads. Every method is synchronous and runs one short transaction, like :class:`~.repo.Registry`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.orm import Session

from ..errors import InvalidArgument, NotFound
from . import models as m
from .db import Database

QUOTA_FIELDS = (
    "sandboxes",
    "vcpus",
    "memory_mib",
    "snapshot_bytes",
    "templates",
    "default_ttl_s",
    "max_ttl_s",
    "hibernated",
    "volumes",
    "volume_bytes",
)
COUNTED_STATUSES = ("starting", "running", "paused", "hibernated")
"""Sandbox rows that count as sandboxes of their workspace (``lost``, ``stopped`` and ``error`` do not)."""
HOLDING_STATUSES = ("starting", "running", "paused")
"""Sandbox rows whose vCPUs and memory count (a hibernated sandbox holds no host memory)."""
_MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class QuotaOverrides:
    """A workspace's own limits; ``None`` means the server default. ``default_ttl_s`` 0 means no default TTL."""

    sandboxes: int | None = None
    vcpus: int | None = None
    memory_mib: int | None = None
    snapshot_bytes: int | None = None
    templates: int | None = None
    default_ttl_s: int | None = None
    max_ttl_s: int | None = None
    hibernated: int | None = None
    volumes: int | None = None
    volume_bytes: int | None = None

    def values(self) -> dict[str, int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SandboxUse:
    id: str
    status: str
    cpus: int
    memory_mib: int


@dataclass(frozen=True)
class WorkspaceUse:
    """What a workspace's rows hold now (before any admission in flight is added)."""

    overrides: QuotaOverrides
    sandboxes: list[SandboxUse]
    """Rows in :data:`COUNTED_STATUSES`."""
    snapshot_bytes: int = 0
    templates: list[str] = field(default_factory=list)
    """Names of the workspace's custom templates (any status: a failed build still holds its name)."""
    volumes: int = 0
    volume_bytes: int = 0
    """Its volumes and their sizes."""


def _check(values: dict[str, int | None]) -> dict[str, int | None]:
    unknown = sorted(set(values) - set(QUOTA_FIELDS))
    if unknown:
        raise InvalidArgument(f"unknown quota field(s): {', '.join(unknown)}", details={"fields": unknown})
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"quota {name} must be a non-negative integer, not {value!r}", details={name: value})
        if name not in ("snapshot_bytes", "memory_mib", "volume_bytes") and value > _MAX_INT32:
            raise InvalidArgument(f"quota {name} is too large: {value}", details={name: value})
    if values.get("max_ttl_s") == 0:
        raise InvalidArgument("quota max_ttl_s must be at least 1 second", details={"max_ttl_s": 0})
    return values


def _overrides(obj: m.WorkspaceQuota | None) -> QuotaOverrides:
    if obj is None:
        return QuotaOverrides()
    return QuotaOverrides(**{name: getattr(obj, name) for name in QUOTA_FIELDS})


class QuotaRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self, workspace_id: str) -> QuotaOverrides:
        with self._db.session(write=False) as s:
            return _overrides(s.get(m.WorkspaceQuota, workspace_id))

    def set(self, workspace_id: str, **values: Any) -> QuotaOverrides:
        """Set some of the workspace's limits (the others keep theirs); ``None`` for a field means its default."""
        changes = _check(dict(values))
        with self._db.session(what=f"quota of workspace {workspace_id}") as s:
            if s.get(m.Workspace, workspace_id) is None:
                raise NotFound(f"workspace {workspace_id} not found", details={"workspace_id": workspace_id})
            obj = s.get(m.WorkspaceQuota, workspace_id)
            if obj is None:
                obj = m.WorkspaceQuota(workspace_id=workspace_id, updated_at=time.time())
                s.add(obj)
            for name, value in changes.items():
                setattr(obj, name, value)
            obj.updated_at = time.time()
            s.flush()
            return _overrides(obj)

    def clear(self, workspace_id: str) -> None:
        """Back to the server defaults (idempotent)."""
        with self._db.session(what=f"quota of workspace {workspace_id}") as s:
            s.execute(delete(m.WorkspaceQuota).where(m.WorkspaceQuota.workspace_id == workspace_id))

    def sandbox_use(self, workspace_id: str) -> WorkspaceUse:
        """The workspace's overrides and the sandboxes it counts, in one (reading) transaction: what admitting a
        sandbox checks. Its snapshots, templates and volumes are not read (empty, zero)."""
        with self._db.session(write=False) as s:
            return WorkspaceUse(
                overrides=_overrides(s.get(m.WorkspaceQuota, workspace_id)), sandboxes=_sandboxes(s, workspace_id)
            )

    def use(self, workspace_id: str) -> WorkspaceUse:
        """The workspace's overrides and usage, in one (reading) transaction."""
        with self._db.session(write=False) as s:
            overrides = _overrides(s.get(m.WorkspaceQuota, workspace_id))
            sandboxes = _sandboxes(s, workspace_id)
            snapshot_bytes = s.scalar(
                select(func.coalesce(func.sum(m.Snapshot.size_bytes), 0)).where(m.Snapshot.workspace_id == workspace_id)
            )
            templates = list(s.scalars(select(m.Template.name).where(m.Template.workspace_id == workspace_id)))
            volumes, volume_bytes = s.execute(
                select(func.count(m.Volume.id), func.coalesce(func.sum(m.Volume.size_bytes), 0)).where(
                    m.Volume.workspace_id == workspace_id
                )
            ).one()
        return WorkspaceUse(
            overrides=overrides,
            sandboxes=sandboxes,
            snapshot_bytes=int(snapshot_bytes or 0),
            templates=templates,
            volumes=int(volumes),
            volume_bytes=int(volume_bytes or 0),
        )


COUNTED = select(m.Sandbox.id, m.Sandbox.status, m.Sandbox.cpus, m.Sandbox.memory_mib).where(
    m.Sandbox.workspace_id == bindparam("workspace_id"), m.Sandbox.status.in_(COUNTED_STATUSES)
)
"""A workspace's counted sandboxes; built once (every create's admission reads it)."""


def _sandboxes(s: Session, workspace_id: str) -> list[SandboxUse]:
    return [
        SandboxUse(id=row.id, status=row.status, cpus=row.cpus, memory_mib=row.memory_mib)
        for row in s.execute(COUNTED, {"workspace_id": workspace_id})
    ]
