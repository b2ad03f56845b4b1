"""The registry: cryobox's durable state (workspaces, API keys, templates, sandboxes, snapshots, the fleet).

SQLite by default (``<data_dir>/registry.sqlite``), PostgreSQL when ``CRYOBOX_DATABASE_URL`` says so; the schema
is managed by the Alembic revisions shipped in ``migrations/`` and applied by :meth:`Registry.migrate`.
"""

from __future__ import annotations

from .db import DATABASE_URL_ENV, AlreadyExists, Database, normalize_url, url_for_data_dir
from .fleet import FleetRecords
from .moves import MoveRecords
from .quotas import QuotaOverrides, QuotaRecords, WorkspaceUse
from .repo import Registry
from .rows import (
    ACTIVE_STATUSES,
    AGENT_DOWN,
    AGENT_DRAINING,
    AGENT_STATUSES,
    AGENT_UP,
    HIBERNATED,
    HIBERNATION_LOCAL,
    HIBERNATION_STORED,
    LOST,
    ON_TIMEOUT_ACTIONS,
    ON_TIMEOUT_HIBERNATE,
    ON_TIMEOUT_KILL,
    STOPPED_STATUSES,
    AgentLoad,
    AgentRow,
    ApiKeyInfo,
    HeartbeatOutcome,
    HostReconcile,
    ReconcileReport,
    ReservationRow,
    SandboxRow,
    SnapshotRow,
    TemplateRow,
    WorkspaceInfo,
)

__all__ = [
    "ACTIVE_STATUSES",
    "AGENT_DOWN",
    "AGENT_DRAINING",
    "AGENT_STATUSES",
    "AGENT_UP",
    "DATABASE_URL_ENV",
    "HIBERNATED",
    "HIBERNATION_LOCAL",
    "HIBERNATION_STORED",
    "LOST",
    "ON_TIMEOUT_ACTIONS",
    "ON_TIMEOUT_HIBERNATE",
    "ON_TIMEOUT_KILL",
    "STOPPED_STATUSES",
    "AgentLoad",
    "AgentRow",
    "AlreadyExists",
    "ApiKeyInfo",
    "Database",
    "FleetRecords",
    "HeartbeatOutcome",
    "HostReconcile",
    "MoveRecords",
    "QuotaOverrides",
    "QuotaRecords",
    "ReconcileReport",
    "Registry",
    "ReservationRow",
    "SandboxRow",
    "SnapshotRow",
    "TemplateRow",
    "WorkspaceInfo",
    "WorkspaceUse",
    "normalize_url",
    "url_for_data_dir",
]
