"""What the agent tells the control plane about a sandbox, a template and the host (plain interface values)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ...agentapi import models as am
from ..sandbox.sandbox import Sandbox
from ..templates.bake import Template


def sandbox_info(sandbox: Sandbox, now: float) -> am.SandboxInfo:
    return am.SandboxInfo(
        id=sandbox.id,
        template=sandbox.template,
        cpus=sandbox.cpus,
        memory_mib=sandbox.memory_mib,
        state=sandbox.state.value,
        workspace_id=sandbox.workspace_id,
        created_at=sandbox.created_at,
        metadata=dict(sandbox.metadata),
        env=dict(sandbox.env),
        boot_mode="cold" if sandbox.boot_mode == "cold" else "restore",
        boot_ms=sandbox.boot_ms,
        from_snapshot=sandbox.from_snapshot,
        instance_id=sandbox.instance_id or None,
        guest_ip=sandbox.guest_ip,
        vm_id=sandbox.vm.vm_id,
        ttl_s=sandbox.ttl_s,
        persistent=sandbox.persistent,
        last_active=sandbox.last_active,
        in_flight=sandbox.in_flight,
        expires_at=sandbox.expires_at,
        idle_s=round(sandbox.idle_s(now), 3),
        expired=sandbox.expired(now),
        egress=list(sandbox.egress) if sandbox.egress is not None else None,
        adopted=sandbox.adopted,
    )


def template_info(template: Template) -> am.TemplateInfo:
    return am.TemplateInfo(
        name=template.name,
        generation=template.generation,
        cpus=template.machine.cpus,
        memory_mib=template.machine.memory_mib,
        created_at=template.created_at,
        path=str(template.path),
    )


def host_memory_mib() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 4096
