"""An in-process control plane (fake agent, real SQLite registry) and the console's app, for the console's
unit tests (a plain module: bind ``console_env`` into a test module under the name its tests ask for)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import Intervals, create_app
from cryobox.console.state import ConsoleState
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.quotas import Quota
from cryobox.server.control.sandboxes import ControlPlane
from cryobox.server.routes.deps import AppContext
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent

BASE = "http://ctl"


@dataclass
class ConsoleEnv:
    registry: Registry
    control: ControlPlane
    agent: FakeAgent
    app: FastAPI
    client: httpx.AsyncClient
    """No credentials of its own: it keeps the cookies the app sets."""
    workspace_id: str
    key_id: str
    key: str

    @property
    def ctx(self) -> AppContext:
        ctx: AppContext = self.app.state.ctx
        return ctx

    @property
    def console(self) -> ConsoleState:
        state: ConsoleState = self.app.state.console
        return state

    async def login(self, key: str | None = None) -> str:
        """Log in; the CSRF token."""
        response = await self.client.post("/ui/login", json={"api_key": key or self.key})
        assert response.status_code == 200, response.text
        return str(response.json()["csrf_token"])


async def make_env(registry: Registry, env: dict[str, str] | None = None) -> AsyncIterator[ConsoleEnv]:
    agent = FakeAgent(name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20)
    control = control_plane(registry, {"a": agent}, quota=Quota())
    limiter = RateLimiter.from_config(RateLimitConfig.from_env(env or {}))
    app = create_app(control, limiter=limiter, host="x", intervals=Intervals(key_cache_s=0.0))
    await control.fleet.heartbeat(await heartbeat_of(agent))
    ws = registry.ensure_workspace("alpha").id
    info, key = registry.create_key(ws)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        try:
            yield ConsoleEnv(registry, control, agent, app, client, ws, info.id, key)
        finally:
            await close_control(control)


@pytest.fixture
async def console_env(registry: Registry) -> AsyncIterator[ConsoleEnv]:
    async for env in make_env(registry):
        yield env
