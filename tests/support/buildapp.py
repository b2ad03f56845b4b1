"""A control plane with an object store and a fake agent whose recipe builds print step logs, served on loopback:
the ``build_env`` fixture of the template-build tests (cryobox's routes, PandaStack's SDK, cryobox's SDK, the CLI,
the console). A test module takes ``from tests.support.buildapp import BuildEnv, build_env, registry``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import create_app, wire_registration
from cryobox.image.recipe.model import Recipe
from cryobox.objstore.client import open_store
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.sandboxes import ControlPlane
from tests.support import registry as registry_support
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent
from tests.support.serving import serving

registry = registry_support.sqlite_registry

DOCKERFILE = """\
FROM debian:bookworm-slim
ARG GREETING=hello
ENV APP_HOME=/srv/app
WORKDIR /srv/app
COPY app/ ./app/
COPY config/settings.toml /etc/demo/settings.toml
RUN echo "$GREETING" > /srv/app/greeting
CMD ["python3", "-m", "http.server", "8000"]
"""


def write_context(root: Path) -> Path:
    """A context of a few files in subdirectories, one of them left out by ``.dockerignore``."""
    (root / "app" / "lib").mkdir(parents=True)
    (root / "config").mkdir()
    (root / "app" / "main.py").write_text("print('hi')\n")
    (root / "app" / "lib" / "util.py").write_text("X = 1\n")
    (root / "app" / "secret.key").write_text("do not ship\n")
    (root / "config" / "settings.toml").write_text("debug = false\n")
    (root / ".dockerignore").write_text("app/secret.key\n")
    (root / "Dockerfile").write_text(DOCKERFILE)
    return root


@dataclass
class BuildEnv:
    url: str
    key: str
    agent: FakeAgent
    control: ControlPlane
    registry: Registry
    workspace_id: str

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)

    def recipes(self) -> list[Recipe]:
        """The recipes the agent was asked to build, in order."""
        specs = [args[0].spec for method, args in self.agent.calls if method == "build_template"]
        return [Recipe.from_json(s.recipe) for s in specs if s.recipe is not None]

    def stored_contexts(self) -> list[str]:
        objects = self.control.builds.objects
        assert objects is not None
        return sorted(objects.list("build-contexts/"))

    async def wait_build(self, name: str, build_id: str, timeout_s: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        async with self.client() as http:
            while True:
                reply = await http.get(f"/v1/templates/{name}/builds/{build_id}")
                assert reply.status_code == 200, reply.text
                body: dict[str, Any] = reply.json()
                if body["status"] in ("done", "failed") or time.monotonic() > deadline:
                    return body
                await asyncio.sleep(0.05)


@pytest.fixture
async def build_env(registry: Registry) -> AsyncIterator[BuildEnv]:
    objects = open_store("memory://")
    agent = FakeAgent(name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20, objects=objects)
    agent.recipe_log_lines = 3
    control = control_plane(registry, {"a": agent}, objects=objects)
    wire_registration(control)
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x")
    await control.fleet.heartbeat(await heartbeat_of(agent))
    ws = registry.ensure_workspace("alpha").id
    _, key = registry.create_key(ws)
    try:
        async with serving(app) as url:
            yield BuildEnv(url, key, agent, control, registry, ws)
    finally:
        await close_control(control)


__all__ = ["DOCKERFILE", "BuildEnv", "build_env", "registry", "write_context"]
