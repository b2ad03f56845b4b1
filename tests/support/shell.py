"""A fake agent that plays the shell (the routes run every command as ``/bin/sh -c <cmd>``: :class:`ShellAgent` runs the
command's first word as the fake's ``cmd``), for the process routes' and the SDK's process tests."""

from __future__ import annotations

import asyncio
import base64
import shlex
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cryobox.agentapi import models as am
from cryobox.errors import GuestError
from cryobox.server.routes.procs import aclose
from tests.support.app import Env
from tests.support.fake_agent import FakeAgent


async def relay(events: AsyncIterator[am.ProcEvent]) -> AsyncIterator[am.ProcEvent]:
    """``events``, closed as soon as this is (a bare ``async for`` would leave that to the garbage collector)."""
    try:
        async for event in events:
            yield event
    finally:
        await aclose(events)


class ShellAgent(FakeAgent):
    """``/bin/sh -c "echo hi"`` runs the fake's ``echo`` with ``["hi"]``; ``started`` keeps what was asked."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.started: list[am.ProcStart] = []
        self.broken: str | None = None
        """``raise``: connect streams fail after some output; ``end``: they end without an exit code."""

    async def proc_start(self, sandbox_id: str, request: am.ProcStart) -> AsyncIterator[am.ProcEvent]:
        self.started.append(request)
        if request.cmd == "/bin/sh" and len(request.args) == 2 and request.args[0] == "-c":
            word, *rest = shlex.split(request.args[1])
            request = request.model_copy(update={"cmd": word, "args": rest})
        async for event in relay(super().proc_start(sandbox_id, request)):
            yield event

    async def proc_connect(self, sandbox_id: str, process: am.ProcSelector) -> AsyncIterator[am.ProcEvent]:
        if self.broken is None:
            async for event in relay(super().proc_connect(sandbox_id, process)):
                yield event
            return
        yield am.ProcEvent(kind="start", pid=process.pid)
        yield am.ProcEvent(kind="stdout", pid=process.pid, data_b64=base64.b64encode(b"half \xe2\x82").decode())
        if self.broken == "raise":
            raise GuestError("the guest went away")
        yield am.ProcEvent(kind="end", pid=process.pid, status="", error="exec: no such file")

    def signals(self) -> list[int]:
        return [args[1].signal for name, args in self.calls if name == "proc_signal"]


@pytest.fixture
def agent() -> ShellAgent:
    return ShellAgent(name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20)


@pytest.fixture
async def sid(env: Env) -> str:
    return await env.made()


async def eventually(check: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)
