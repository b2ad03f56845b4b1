"""``GET /v1/info``'s accelerator is what the agents report: the control plane never probes its own host (a control
plane on a laptop in front of KVM hosts says ``kvm``), falls back to agents that are not live, and claims the
weaker ``tcg`` when no agent ever registered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from cryobox.agentapi import models as am
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import create_app
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.fleet import FleetConfig
from tests.support.clock import FakeClock
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent


async def get_info(registry: Registry, app: FastAPI) -> dict[str, Any]:
    _, key = registry.create_key(registry.ensure_workspace("w").id)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ctl", headers=headers) as c:
        response = await c.get("/v1/info")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


class KvmAgent(FakeAgent):
    async def info(self) -> am.AgentInfo:
        return (await super().info()).model_copy(update={"accelerator": "kvm"})


async def accelerator(registry: Registry, agents: dict[str, FakeAgent], clock: FakeClock) -> str:
    control = control_plane(registry, config=FleetConfig(deadline_s=10.0, node_token="t"), clock=clock)
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="ctl")
    try:
        for agent in agents.values():
            await control.fleet.heartbeat(await heartbeat_of(agent))
        clock.advance(60.0)  # every agent silent past the deadline: none is live
        body = await get_info(registry, app)
        assert body["hosts"] == []
        return str(body["accelerator"])
    finally:
        await close_control(control)


async def test_the_accelerator_is_the_agents_not_the_control_planes(tmp_path: Path) -> None:
    registry = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    registry.migrate()
    try:
        assert await accelerator(registry, {}, FakeClock()) == "tcg"  # nobody ever registered: the weaker claim
        assert await accelerator(registry, {"k": KvmAgent(name="k")}, FakeClock()) == "kvm"  # registered, not live
    finally:
        registry.close()


async def test_a_live_agent_reports_its_accelerator(tmp_path: Path) -> None:
    registry = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    registry.migrate()
    control = control_plane(registry, {"k": KvmAgent(name="k")}, config=FleetConfig(deadline_s=10.0, node_token="t"))
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="ctl")
    try:
        await control.fleet.heartbeat(await heartbeat_of(KvmAgent(name="k")))
        body = await get_info(registry, app)
        assert (body["hosts"], body["accelerator"]) == (["k"], "kvm")
    finally:
        await close_control(control)
        registry.close()
