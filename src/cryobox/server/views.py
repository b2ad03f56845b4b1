"""Host-agent objects -> wire models."""

from __future__ import annotations

from typing import Any, cast

from .. import models
from ..agent.sandbox import Sandbox, rfc3339
from ..agent.templates import Template
from ..models import BootMode


def sandbox_view(sandbox: Sandbox, host: str) -> models.Sandbox:
    expires = sandbox.expires_at
    return models.Sandbox(
        id=sandbox.id,
        template=sandbox.template,
        cpu=sandbox.cpus,
        memory_mb=sandbox.memory_mib,
        status=sandbox.state.value,
        guest_ip=None,
        metadata=sandbox.metadata,
        from_snapshot=None,
        boot_ms=sandbox.boot_ms,
        boot_mode=cast(BootMode, sandbox.boot_mode),
        created_at=rfc3339(sandbox.created_at),
        persistent=sandbox.persistent,
        expires_at=rfc3339(expires) if expires is not None else None,
        host=host,
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
