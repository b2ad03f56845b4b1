"""The system sandboxes the volume content API runs in (:mod:`.volumecontent`): made and deleted through the
control plane like any other sandbox, so placement, quotas, the volume's attachment and the TTL all apply."""

from __future__ import annotations

from typing import Protocol

from ...agentapi import Agent
from ...registry import SandboxRow
from ...registry.volumes import VolumeRow
from .createrequest import CreateRequest
from .volumecontent import SYSTEM_KEY, SYSTEM_VALUE
from .volumes import MountRequest


class Sandboxes(Protocol):
    """The control plane's calls a system sandbox needs."""

    async def create(self, request: CreateRequest, timing: dict[str, float] | None = None) -> SandboxRow: ...

    async def route(
        self, sandbox_id: str, workspace_id: str | None, *, wake: bool = True, explicit: bool = False
    ) -> tuple[SandboxRow, Agent]: ...

    async def delete(
        self, sandbox_id: str, workspace_id: str | None, keep_snapshots: bool = False, *, host: str | None = None
    ) -> None: ...


TEMPLATE = "base"
TTL_S = 300
"""A backstop: the content API deletes its idle sandboxes long before (a control plane that died does not)."""


class SystemSandboxes:
    def __init__(self, control: Sandboxes) -> None:
        self.control = control

    async def make(self, row: VolumeRow, mount: MountRequest) -> tuple[str, Agent]:
        request = CreateRequest(
            template=TEMPLATE,
            workspace_id=row.workspace_id,
            metadata={SYSTEM_KEY: SYSTEM_VALUE, "cryobox.volume": row.name},
            env={},
            ttl_s=TTL_S,
            persistent=False,
            egress=None,
            volumes=(mount,),
        )
        made = await self.control.create(request)
        _, agent = await self.control.route(made.id, row.workspace_id)
        return made.id, agent

    async def remove(self, sandbox_id: str, workspace_id: str) -> None:
        await self.control.delete(sandbox_id, workspace_id)
