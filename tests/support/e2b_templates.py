"""A served control plane with one fake agent (a memory object store) for E2B's template SDK, run unchanged in its
own virtualenv (:func:`python`) by the applications in ``tests/integration/apps``: bind the fixture into a test
module as ``served = e2b_templates.served`` (with ``registry`` bound there too)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import create_app, wire_registration
from cryobox.config import Paths
from cryobox.objstore.client import open_store
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from tests.support.control import close_control, control_plane
from tests.support.e2b import e2b_env, sdk_python
from tests.support.fake_agent import FakeAgent
from tests.support.paths import APPS
from tests.support.serving import serving


def python() -> Path:
    """The pinned SDK's python (its virtualenv made on first use, in the cache dir the suite uses)."""
    return sdk_python(Paths.from_env().cache_dir)


class Served:
    def __init__(self, url: str, key: str, agent: FakeAgent, home: Path, workspace_id: str) -> None:
        self.url, self.key, self.agent, self.home, self.workspace_id = url, key, agent, home, workspace_id

    async def app(self, app: str, *args: str) -> dict[str, Any]:
        """Run ``tests/integration/apps/<app>`` with ``args``; its report (the last line it prints, JSON)."""
        proc = await asyncio.create_subprocess_exec(
            str(python()),
            str(APPS / app),
            *args,
            env=e2b_env(self.url, self.key, self.home),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert out.strip(), err.decode()[-4000:]
        report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return report

    async def run(self, context: Path, name: str, expect: str) -> dict[str, Any]:
        """``e2b_template_app.py``: builds ``context`` as ``name``, ``expect`` ``ok`` or ``fail``."""
        return await self.app("e2b_template_app.py", str(context), name, expect)


@pytest.fixture
async def served(registry: Registry, tmp_path: Path) -> AsyncIterator[Served]:
    objects = open_store("memory://")
    agent = FakeAgent(name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20, objects=objects)
    agent.recipe_log_lines = 60  # 7 phases: 420 lines, five pages of the status route
    control = control_plane(registry, {"a": agent}, objects=objects)
    wire_registration(control)
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x")
    await control.fleet.heartbeat(await heartbeat_of(agent))
    ws = registry.ensure_workspace("alpha").id
    _, key = registry.create_key(ws)
    try:
        async with serving(app) as url:
            yield Served(url, key, agent, tmp_path, ws)
    finally:
        await close_control(control)


def context_dir(tmp_path: Path) -> Path:
    app = tmp_path / "ctx" / "app"
    app.mkdir(parents=True)
    (app / "requirements.txt").write_text("flask\n")
    (app / "main.py").write_text("print('hi')\n")
    return tmp_path / "ctx"
