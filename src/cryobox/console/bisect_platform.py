"""How a bisect job reaches the platform: :class:`Platform` (a protocol; fakes in tests) and
:class:`ControlPlatform`, the control plane itself with the caller's workspace on every call."""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..agentapi import models as am
from ..server.control.createrequest import CreateRequest
from ..server.control.forks import ForkControl
from ..server.control.sandboxes import ControlPlane

JOB_LABEL = "cryobox.bisect_job"
"""Metadata on every sandbox a job makes: what is left with it when the job ends is deleted."""


class Platform(Protocol):
    """What a job needs of the control plane (the real one: :class:`ControlPlatform`; fakes in tests)."""

    async def restore(self, snapshot_id: str, workspace_id: str, metadata: dict[str, str], ttl_s: int) -> str: ...

    async def fork_tree(
        self, sandbox_id: str, workspace_id: str, count: int, metadata: dict[str, str]
    ) -> tuple[str, list[str], list[tuple[int, str]]]:
        """``(snapshot_id, child ids, [(index, error)])``."""
        ...

    async def exec(self, sandbox_id: str, workspace_id: str, command: str, timeout_s: float) -> am.ExecResult: ...

    async def delete(self, sandbox_id: str, workspace_id: str) -> None: ...

    async def delete_snapshot(self, snapshot_id: str, workspace_id: str) -> None: ...

    async def labelled(self, workspace_id: str, metadata: dict[str, str]) -> list[str]:
        """Ids of the workspace's live sandboxes carrying ``metadata``."""
        ...


class ControlPlatform:
    """:class:`Platform` over the control plane, with the caller's workspace on every call."""

    def __init__(self, control: ControlPlane, forks: ForkControl) -> None:
        self.control = control
        self.forks = forks

    async def restore(self, snapshot_id: str, workspace_id: str, metadata: dict[str, str], ttl_s: int) -> str:
        row = await self.control.create(
            CreateRequest(
                template="",
                workspace_id=workspace_id,
                metadata=metadata,
                env={},
                ttl_s=ttl_s,
                persistent=False,
                from_snapshot=snapshot_id,
            )
        )
        return row.id

    async def fork_tree(
        self, sandbox_id: str, workspace_id: str, count: int, metadata: dict[str, str]
    ) -> tuple[str, list[str], list[tuple[int, str]]]:
        tree = await self.forks.fork_tree(sandbox_id, workspace_id, count=count, metadata=metadata)
        return tree.snapshot.id, [c.id for c in tree.children], list(tree.errors)

    async def exec(self, sandbox_id: str, workspace_id: str, command: str, timeout_s: float) -> am.ExecResult:
        agent = await self.control.agent_for(sandbox_id, workspace_id)
        return await agent.exec(sandbox_id, am.ExecRequest(cmd=command, timeout_s=timeout_s))

    async def delete(self, sandbox_id: str, workspace_id: str) -> None:
        await self.control.delete(sandbox_id, workspace_id)

    async def delete_snapshot(self, snapshot_id: str, workspace_id: str) -> None:
        await self.control.snapshots.delete(snapshot_id, workspace_id)

    async def labelled(self, workspace_id: str, metadata: dict[str, str]) -> list[str]:
        rows = await asyncio.to_thread(self.control.registry.list_sandboxes, workspace_id, None, metadata)
        return [r.id for r in rows]
