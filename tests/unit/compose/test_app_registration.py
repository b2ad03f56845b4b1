"""The app's start-up and this host's in-process agents: a first start registers them before it serves; a
restart or an upgrade (their rows alive from the previous process's heartbeats) serves at once and registers
them right after (a new boot's reconcile held up the start by 0.1-0.4 s, inside the restart's gap)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import create_app
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.quotas import Quota
from tests.support.app import registry
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture


async def _start(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, str]], asyncio.Event]:
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send))
    return task, inbox, started


async def _held_heartbeats(control: Any) -> tuple[asyncio.Event, list[str]]:
    """Make the control plane's heartbeats wait for the returned event; the list gets each agent that beat."""
    gate, beaten = asyncio.Event(), []
    plain: Callable[[Any], Awaitable[Any]] = control.fleet.heartbeat

    async def heartbeat(hb: Any) -> Any:
        await gate.wait()
        beaten.append(hb.agent.name)
        return await plain(hb)

    control.fleet.heartbeat = heartbeat
    return gate, beaten


async def test_a_first_start_registers_before_serving_a_restart_serves_first(registry: Registry) -> None:
    for previous_alive in (False, True):
        agent = FakeAgent(name="local")
        control = control_plane(registry, {}, quota=Quota(), clock=time.time)
        if previous_alive:  # the previous process of this agent beat a moment ago (the first round: no row)
            await control.fleet.heartbeat(await heartbeat_of(agent))
        app = create_app(
            control,
            limiter=RateLimiter.from_config(RateLimitConfig.from_env({})),
            host="local",
            local_agents={"local": agent},
        )
        gate, beaten = await _held_heartbeats(control)
        task, inbox, started = await _start(app)
        await asyncio.sleep(0.2)
        assert started.is_set() is previous_alive  # a restart serves while its registration waits
        gate.set()
        await asyncio.wait_for(started.wait(), 5)
        for _ in range(100):
            if beaten:
                break
            await asyncio.sleep(0.01)
        assert beaten == ["local"]  # registered either way
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 10)
        await close_control(control)
