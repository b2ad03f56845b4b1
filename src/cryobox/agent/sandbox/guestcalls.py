"""Requests into a sandbox's guest, through its agent: exec (one-shot and streamed), files, network inspection.

Mixed into :class:`~.service.SandboxService`. Every request wakes a hibernated sandbox first, refuses one that
is not running (``StateError``) and touches its idle clock; the sandbox's own env is the base of every exec's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from ...agentapi.interface import MAX_FILE_BYTES
from ...errors import PayloadTooLarge
from ...util.encoding import b64, unb64
from ..guest.client import FILE_REPLY, LISTING_REPLY, GuestClient
from ..guest.exec import ExecEvent, ExecResult, ExecSpec, run_exec, stream_exec
from .sandbox import Sandbox, SandboxState


class GuestCalls:
    """The guest requests of :class:`~.service.SandboxService` (which provides ``get``, ``resume``, ``clock``)."""

    clock: Callable[[], float]

    def get(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        raise NotImplementedError  # SandboxService's

    async def resume(self, sandbox_id: str, workspace_id: str | None = None) -> Sandbox:
        raise NotImplementedError  # SandboxService's (its lifecycle)

    async def guest(self, sandbox_id: str, workspace_id: str | None = None) -> tuple[Sandbox, GuestClient]:
        sandbox = self.get(sandbox_id, workspace_id)
        if sandbox.state is SandboxState.HIBERNATED:  # any request wakes it
            await self.resume(sandbox_id, workspace_id)
        sandbox.require_running()
        sandbox.touch(self.clock())
        return sandbox, await sandbox.vm.connect_guest()

    def _spec(self, sandbox: Sandbox, spec: ExecSpec) -> ExecSpec:
        if not sandbox.env:
            return spec
        return dataclasses.replace(spec, env={**sandbox.env, **spec.env})

    async def exec(self, sandbox_id: str, spec: ExecSpec, workspace_id: str | None = None) -> ExecResult:
        sandbox, guest = await self.guest(sandbox_id, workspace_id)
        return await run_exec(guest, self._spec(sandbox, spec))

    async def exec_stream(
        self, sandbox_id: str, spec: ExecSpec, workspace_id: str | None = None
    ) -> AsyncIterator[ExecEvent]:
        sandbox, guest = await self.guest(sandbox_id, workspace_id)
        async for event in stream_exec(guest, self._spec(sandbox, spec)):
            yield event

    async def read_file(self, sandbox_id: str, path: str, workspace_id: str | None = None) -> bytes:
        _, guest = await self.guest(sandbox_id, workspace_id)
        return unb64((await guest.call("read_file", {"path": path}, timeout=120, max_reply=FILE_REPLY)).get("content"))

    async def write_file(
        self, sandbox_id: str, path: str, data: bytes, workspace_id: str | None = None, *, user: str | None = None
    ) -> dict[str, Any]:
        if len(data) > MAX_FILE_BYTES:
            raise PayloadTooLarge(f"file of {len(data)} bytes exceeds {MAX_FILE_BYTES}")
        _, guest = await self.guest(sandbox_id, workspace_id)
        args: dict[str, Any] = {"path": path, "content": b64(data)}
        if user is not None:
            args["user"] = user  # what the write creates (the file, missing parents) is owned by that user
        return await guest.call("write_file", args, timeout=120)

    async def inspect_net(self, sandbox_id: str, workspace_id: str | None = None) -> dict[str, Any]:
        """The guest's sockets, neighbours, resolver config, interfaces, clocks and instance id."""
        _, guest = await self.guest(sandbox_id, workspace_id)
        return await guest.call("inspect_net", {}, timeout=60)

    async def file_op(self, sandbox_id: str, op: str, path: str, workspace_id: str | None = None) -> dict[str, Any]:
        _, guest = await self.guest(sandbox_id, workspace_id)
        return await guest.call(op, {"path": path}, timeout=60, max_reply=LISTING_REPLY)
