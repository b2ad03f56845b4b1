"""What the agent tells the control plane about a template and the host (plain interface values); a sandbox's
info is :func:`..sandbox.mapping.sandbox_info`, re-exported here."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ...agentapi import models as am
from ..sandbox.mapping import sandbox_info as sandbox_info  # the one Sandbox -> SandboxInfo mapping
from ..templates.bake import Template


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
