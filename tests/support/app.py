"""The public API's app (``create_app``) over a control plane with one in-process fake agent (``a``) on a real
(SQLite) registry, and an ASGI client with a key of workspace ``alpha``: the ``env`` fixture.

A test module takes the fixtures together, ``from tests.support.app import Env, agent, env, quota, registry``;
it may override ``agent`` (another fake) or ``quota`` (:func:`limits`) by defining its own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import create_app
from cryobox.registry import QuotaRecords, Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.quotas import Quota
from cryobox.server.control.sandboxes import ControlPlane
from tests.support import registry as registry_support
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent

registry = registry_support.sqlite_registry


@dataclass
class Env:
    registry: Registry
    control: ControlPlane
    agent: FakeAgent
    client: httpx.AsyncClient
    ws: str
    transport: httpx.AsyncBaseTransport | None = None
    """The app's ASGI transport (for a client without the key)."""

    @property
    def records(self) -> QuotaRecords:
        return self.control.quotas.records

    async def create(self, **kw: Any) -> httpx.Response:
        return await self.client.post("/v1/sandboxes", json={"template": "base", **kw})

    async def made(self, **kw: Any) -> str:
        response = await self.create(**kw)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def calls(self, method: str) -> int:
        return self.agent.call_names().count(method)

    def ttls(self) -> dict[str, int | None]:
        """The TTL of every create the agent was asked for."""
        specs = [args[0] for method, args in self.agent.calls if method == "create"]
        return {spec.sandbox_id: spec.ttl_s for spec in specs}

    def rows(self) -> int:
        return len(self.registry.list_sandboxes(self.ws))


@pytest.fixture
def quota() -> Quota:
    return Quota()


@pytest.fixture
def agent() -> FakeAgent:
    return FakeAgent(name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20)


@contextlib.asynccontextmanager
async def app_env(
    registry: Registry,
    agent: FakeAgent,
    quota: Quota,
    *,
    clock: Callable[[], float] = time.time,
    **app_options: Any,
) -> AsyncIterator[Env]:
    """A control plane with ``agent`` on ``clock``, its app (``app_options`` go to ``create_app``) and a client of
    workspace ``alpha``."""
    control = control_plane(registry, {"a": agent}, quota=quota, clock=clock)
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x", **app_options)
    await control.fleet.heartbeat(await heartbeat_of(agent))
    ws = registry.ensure_workspace("alpha").id
    _, key = registry.create_key(ws)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://ctl", headers={"Authorization": f"Bearer {key}"}
    ) as client:
        try:
            yield Env(registry, control, agent, client, ws, transport)
        finally:
            await close_control(control)


@pytest.fixture
async def env(registry: Registry, quota: Quota, agent: FakeAgent) -> AsyncIterator[Env]:
    async with app_env(registry, agent, quota) as made:
        yield made


@pytest.fixture
def api(env: Env) -> httpx.AsyncClient:
    """The env's ASGI client (with its API key)."""
    return env.client


def limits(**kw: Any) -> pytest.MarkDecorator:
    """The test runs with these limits (the others are the defaults)."""
    return pytest.mark.parametrize("quota", [Quota(**kw)])
