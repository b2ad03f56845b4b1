"""One vocabulary on the control plane's side: an agent's :class:`~cryobox.agentapi.models.SandboxInfo` <-> a registry
row <-> the public wire model, in one place.

Inside cryobox a sandbox has ``cpus``, ``memory_mib``, ``ttl_s`` and epoch-second times everywhere (the agent's
records, the interface, the registry rows); only the public models speak PandaStack's ``cpu``, ``memory_mb``,
``ttl_seconds`` and RFC 3339 times, and this module is where the two meet (the E2B front door has its own shapes
in :mod:`cryobox.compat.e2b.views`). The agent's side of the same mapping is :mod:`cryobox.agent.sandbox.mapping`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import models
from ..agentapi import models as am
from ..netpolicy import EgressPolicy
from ..registry import SandboxRow, SnapshotRow, TemplateRow
from ..util.times import rfc3339
from . import wire


def row_for(info: am.SandboxInfo, host: str) -> SandboxRow:
    return SandboxRow(
        id=info.id,
        workspace_id=info.workspace_id,
        template=info.template,
        cpus=info.cpus,
        memory_mib=info.memory_mib,
        status=info.state,
        metadata=dict(info.metadata),
        env=dict(info.env),
        boot_ms=info.boot_ms,
        boot_mode=info.boot_mode,
        host=host,
        created_at=info.created_at,
        persistent=info.persistent,
        ttl_s=info.ttl_s,
        expires_at=info.expires_at,
        last_active_at=info.last_active,
        vm_id=info.vm_id,
        from_snapshot=info.from_snapshot,
        guest_ip=info.guest_ip,
        instance_id=info.instance_id,
        egress=info.egress,
    )


def live_row(row: SandboxRow, info: am.SandboxInfo) -> SandboxRow:
    """``row`` with what the agent knows now (state, TTL clock, address)."""
    return replace(
        row,
        status=info.state,
        expires_at=info.expires_at,
        last_active_at=info.last_active,
        ttl_s=info.ttl_s,
        persistent=info.persistent,
        guest_ip=info.guest_ip,
        vm_id=info.vm_id,
    )


def template_row(template: am.TemplateInfo, workspace_id: str | None, spec: dict[str, Any] | None) -> TemplateRow:
    return TemplateRow(
        name=template.name,
        generation=template.generation,
        cpus=template.cpus,
        memory_mib=template.memory_mib,
        status="ready",
        path=template.path,
        created_at=template.created_at,
        workspace_id=workspace_id,
        spec=spec,
    )


def sandbox_view(row: SandboxRow) -> models.Sandbox:
    return models.Sandbox.model_validate(
        {
            "id": row.id,
            "template": row.template,
            "cpu": row.cpus,
            "memory_mb": row.memory_mib,
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
            "network": row.egress if row.egress is not None else models.NetworkPolicy(),
            "on_timeout": row.on_timeout,
            "auto_wake": row.auto_wake,
            "hibernated_at": rfc3339(row.hibernated_at) if row.hibernated_at is not None else None,
        }
    )


def template_view(row: TemplateRow, progress: str | None = None) -> models.Template:
    return models.Template.model_validate(
        {
            "name": row.name,
            "cpu": row.cpus,
            "memory_mb": row.memory_mib,
            "generation": row.generation,
            "status": row.status,
            "created_at": rfc3339(row.created_at),
            "progress": progress if row.status == "building" else None,
            "error": row.error,
        }
    )


def snapshot_row(
    info: am.SnapshotInfo,
    workspace_id: str,
    retain: bool,
    labels: dict[str, str],
    host: str,
    egress: EgressPolicy | None = None,
    volumes: list[dict[str, Any]] | None = None,
) -> SnapshotRow:
    return SnapshotRow(
        volumes=list(volumes or []),
        id=info.id,
        workspace_id=workspace_id,
        template=info.template,
        path=info.path,
        sandbox_id=info.sandbox_id,
        parent_id=info.parent_id,
        size_bytes=info.size_bytes,
        # an agent from before layering does not send it: all of the snapshot is its own, as its manifest says
        unique_bytes=info.unique_bytes if "unique_bytes" in info.model_fields_set else info.size_bytes,
        shared_bytes=info.shared_bytes,
        pause_ms=info.pause_ms,
        labels=dict(labels),
        retain=retain,
        created_at=info.created_at,
        host=host,
        location="local",
        generation=info.generation,
        egress=egress,
    )


def snapshot_view(row: SnapshotRow) -> wire.Snapshot:
    return wire.Snapshot(
        id=row.id,
        sandbox_id=row.sandbox_id,
        template=row.template,
        size_bytes=row.size_bytes,
        unique_bytes=row.unique_bytes,
        shared_bytes=row.shared_bytes,
        created_at=rfc3339(row.created_at),
        labels=row.labels,
        retain=row.retain,
        parent_id=row.parent_id,
        pause_ms=row.pause_ms,
        location=row.location,
        host=row.host or None,
    )
