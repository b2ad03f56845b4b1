"""Registry rows and host-agent objects -> wire models."""

from __future__ import annotations

from typing import Any

from .. import models
from ..agent.sandbox import rfc3339
from ..agent.templates import Template
from ..registry import SandboxRow


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
        }
    )


def template_view(template: Template) -> models.Template:
    return models.Template(
        name=template.name,
        cpu=template.machine.cpus,
        memory_mb=template.machine.memory_mib,
        generation=template.generation,
        status="ready",
        created_at=rfc3339(template.created_at),
    )


def file_entry(raw: dict[str, Any]) -> models.FileEntry:
    return models.FileEntry(
        name=str(raw["name"]),
        is_dir=bool(raw["is_dir"]),
        size=int(raw["size"]),
        mode=int(raw["mode"]),
        mtime=float(raw["mtime"]),
    )
