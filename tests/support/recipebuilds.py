"""A control plane with one fake agent for recipe-build tests (``control.builds``): bind the fixture into a test
module as ``setup = recipebuilds.setup`` (it needs the ``registry`` and ``clock`` fixtures bound there too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import wire_registration
from cryobox.image.recipe.model import Base, Recipe, Step
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.registry import Registry
from cryobox.registry.builds import BuildRecord
from cryobox.server.control.sandboxes import ControlPlane
from tests.support.clock import FakeClock
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent


class Setup:
    def __init__(self, registry: Registry, clock: FakeClock) -> None:
        self.registry, self.clock = registry, clock
        self.objects: ObjectStore = open_store("memory://")
        self.agent = FakeAgent(name="a", clock=clock, objects=self.objects)
        self.control: ControlPlane = control_plane(registry, {"a": self.agent}, clock=clock, objects=self.objects)
        wire_registration(self.control)
        self.ws = registry.ensure_workspace("alpha").id

    def recipe(self, blob: str) -> Recipe:
        return Recipe(
            base=Base("debian", "bookworm"),
            steps=(
                Step("COPY", ("app", "/app"), context=blob),
                Step("RUN", ("make -C /app",)),
                Step("ENV", ("A", "1")),
            ),
            start_cmd="python3 -m http.server 8000",
        )

    async def finished(self, build_id: str, control: ControlPlane | None = None) -> BuildRecord:
        """The build once it ended (read through ``control``, default this setup's)."""
        plane = control or self.control
        async with asyncio.timeout(5):
            while True:
                record = await plane.builds.build(self.ws, build_id)
                if record.status in ("ready", "error") and not plane.templates.building(record.template):
                    return record
                await asyncio.sleep(0.01)


@pytest.fixture
async def setup(registry: Registry, clock: FakeClock) -> AsyncIterator[Setup]:
    made = Setup(registry, clock)
    await made.control.fleet.heartbeat(await heartbeat_of(made.agent))
    try:
        yield made
    finally:
        await close_control(made.control)
