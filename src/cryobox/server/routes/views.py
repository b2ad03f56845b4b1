"""Registry rows and host-agent objects -> wire models."""

from __future__ import annotations

from ... import models
from ...agent.sandbox.sandbox import rfc3339
from ...agentapi import models as am
from ...registry import SandboxRow, TemplateRow


def sandbox_view(row: SandboxRow) -> models.Sandbox:
    return models.Sandbox.model_validate(
        {
            "id": row.id,
            "template": row.template,
            "cpu": row.cpu,
            "memory_mb": row.memory_mb,
            "status": row.status,
            "guest_ip": row.guest_ip,
            "metadata": row.metadata,
            "from_snapshot": row.from_snapshot,
            "boot_ms": row.boot_ms,
            "boot_mode": row.boot_mode,
            "created_at": rfc3339(row.created_at),
            "persistent": row.persistent,
            "expires_at": rfc3339(row.expires_at) if row.expires_at is not None else None,
            "host": row.host,
            "instance_id": row.instance_id,
        }
    )


def template_view(row: TemplateRow, progress: str | None = None) -> models.Template:
    return models.Template.model_validate(
        {
            "name": row.name,
            "cpu": row.cpu,
            "memory_mb": row.memory_mb,
            "generation": row.generation,
            "status": row.status,
            "created_at": rfc3339(row.created_at),
            "progress": progress if row.status == "building" else None,
            "error": row.error,
        }
    )


def file_entry(entry: am.FsEntry) -> models.FileEntry:
    return models.FileEntry(
        name=entry.name,
        is_dir=entry.is_dir,
        size=entry.size,
        mode=entry.mode,
        mtime=entry.mtime if entry.mtime is not None else 0.0,
    )
