"""The registry: cryobox's durable state (workspaces, API keys, templates, sandboxes, snapshots).

SQLite by default (``<data_dir>/registry.sqlite``), PostgreSQL when ``CRYOBOX_DATABASE_URL`` says so; the schema
is managed by the Alembic revisions shipped in ``migrations/`` and applied by :meth:`Registry.migrate`.
"""

from __future__ import annotations

from .db import DATABASE_URL_ENV, AlreadyExists, Database, normalize_url, url_for_data_dir
from .repo import Registry
from .rows import ApiKeyInfo, ReconcileReport, SandboxRow, SnapshotRow, TemplateRow, WorkspaceInfo

__all__ = [
    "DATABASE_URL_ENV",
    "AlreadyExists",
    "ApiKeyInfo",
    "Database",
    "ReconcileReport",
    "Registry",
    "SandboxRow",
    "SnapshotRow",
    "TemplateRow",
    "WorkspaceInfo",
    "normalize_url",
    "url_for_data_dir",
]
