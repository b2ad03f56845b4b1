"""Agents register and heartbeat over HTTP with the node token; anything else is refused and changes nothing."""

from __future__ import annotations

from pathlib import Path

import httpx

from cryobox.agentapi.heartbeat import HeartbeatSender
from cryobox.compose.app import create_app
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.fleet import FleetConfig
from tests.support.control import control_plane
from tests.support.fake_agent import FakeAgent

TOKEN = "node-secret"


def control_app(tmp_path: Path) -> tuple[Registry, httpx.ASGITransport]:
    registry = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}")
    registry.migrate()
    control = control_plane(registry, config=FleetConfig(node_token=TOKEN))
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="ctl")
    return registry, httpx.ASGITransport(app=app)


async def test_an_agent_registers_and_reports_in_with_the_node_token(tmp_path: Path) -> None:
    registry, transport = control_app(tmp_path)
    agent = FakeAgent(name="host-a")
    sender = HeartbeatSender(agent, "http://control", TOKEN, transport=transport)
    try:
        first = await sender.beat()
        assert first.reconciled  # a new boot id: the rows of its host were reconciled
        second = await sender.beat()
        assert not second.reconciled
    finally:
        await sender.aclose()
    (row,) = registry.fleet.list_agents()
    assert (row.name, row.status, row.boot_id) == ("host-a", "up", agent.boot_id)
    assert row.capacity["max_sandboxes"] == agent.max_sandboxes
    registry.close()


async def test_a_wrong_or_missing_token_is_refused_and_registers_nothing(tmp_path: Path) -> None:
    registry, transport = control_app(tmp_path)
    for token in ("wrong", TOKEN + "x", " "):
        sender = HeartbeatSender(FakeAgent(name="intruder"), "http://control", token, transport=transport)
        try:
            try:
                await sender.beat()
                raise AssertionError("a heartbeat with a bad token was accepted")
            except httpx.HTTPStatusError as err:
                assert err.response.status_code == 401
        finally:
            await sender.aclose()
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as client:
        bare = await client.post("/internal/v1/heartbeat", content=b"{}")
        assert bare.status_code == 401
        garbage = await client.post(
            "/internal/v1/heartbeat", content=b"{not json", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert garbage.status_code == 400 and garbage.json()["code"] == "invalid_argument"
    assert registry.fleet.list_agents() == []
    registry.close()
