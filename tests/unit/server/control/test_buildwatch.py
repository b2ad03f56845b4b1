"""Builds whose control plane stopped (``control/buildwatch.py``): a started build's record goes stale when its
heartbeat stops (the control plane running it was closed, as a ``cryobox serve`` restart does), and is then failed
as interrupted wherever it is read, by another replica on the same registry; the name builds again; a first build's
row is gone, a rebuild's previous template keeps serving; a live build (refreshed) and a reservation are not."""

from __future__ import annotations

import asyncio

import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.errors import NotFound, StateError
from cryobox.image.recipe.model import Base, Recipe, Step
from cryobox.registry.builds import BuildRecord
from cryobox.server.control.buildwatch import INTERRUPTED
from cryobox.server.control.sandboxes import ControlPlane
from tests.support import recipebuilds
from tests.support import registry as registry_support
from tests.support.control import close_control, control_plane
from tests.support.recipebuilds import Setup

registry = registry_support.sqlite_registry
clock = registry_support.clock
setup = recipebuilds.setup
RECIPE = Recipe(Base("debian", "bookworm"), (Step("RUN", ("true",)),))


async def doomed_build(setup: Setup, name: str) -> BuildRecord:
    """A build started on another control plane, which is closed while the build is held after its first step."""
    doomed: ControlPlane = control_plane(setup.registry, {"a": setup.agent}, clock=setup.clock, objects=setup.objects)
    await doomed.fleet.heartbeat(await heartbeat_of(setup.agent))
    setup.agent.build_gate = asyncio.Event()
    started = await doomed.builds.start_recipe_build(setup.ws, name=name, recipe=RECIPE, cpus=1, memory_mib=512)
    async with asyncio.timeout(5):
        while not doomed.builds.records.log_count(started.build_id):
            await asyncio.sleep(0.01)
    await close_control(doomed)  # the build dies with it: no outcome is ever written
    setup.agent.build_gate.set()
    await setup.control.fleet.heartbeat(await heartbeat_of(setup.agent))  # closing marked the agent down
    return started


async def test_a_build_whose_control_plane_stopped_is_failed_on_read_and_the_name_builds_again(setup: Setup) -> None:
    builds = setup.control.builds
    started = await doomed_build(setup, "gone")
    setup.clock.advance(builds.stale_after_s)  # not past the bound yet
    assert (await builds.build(setup.ws, started.build_id)).status == "building"
    assert setup.registry.get_template("gone").status == "building"
    with pytest.raises(StateError):
        await builds.start_recipe_build(setup.ws, name="gone", recipe=RECIPE, cpus=1, memory_mib=512)
    setup.clock.advance(1)
    failed = await builds.build(setup.ws, started.build_id)
    assert (failed.status, failed.error, failed.error_step) == ("error", INTERRUPTED, "base")
    assert failed.finished_at == setup.clock()
    assert await builds.build(setup.ws, started.build_id) == failed  # persisted, settled once
    with pytest.raises(NotFound):  # a first build leaves no template behind
        setup.registry.get_template("gone")
    await setup.control.fleet.heartbeat(await heartbeat_of(setup.agent))  # its last one is past the deadline now
    again = await builds.start_recipe_build(setup.ws, name="gone", recipe=RECIPE, cpus=1, memory_mib=512)
    assert (await setup.finished(again.build_id)).status == "ready"
    assert setup.registry.get_template("gone").status == "ready"


async def test_an_interrupted_rebuild_keeps_the_previous_template_serving(setup: Setup) -> None:
    builds = setup.control.builds
    first = await builds.start_recipe_build(setup.ws, name="svc", recipe=RECIPE, cpus=1, memory_mib=512)
    await setup.finished(first.build_id)
    before = setup.registry.get_template("svc")
    rebuild = await doomed_build(setup, "svc")
    setup.clock.advance(builds.stale_after_s + 1)
    latest = await builds.latest_build(setup.ws, "svc")  # what GET /v1/templates/{name} reads
    assert latest is not None and latest.build_id == rebuild.build_id
    assert (latest.status, latest.error) == ("error", INTERRUPTED)
    assert setup.registry.get_template("svc") == before


async def test_listing_the_workspaces_templates_settles_its_interrupted_builds(setup: Setup) -> None:
    started = await doomed_build(setup, "listed")
    setup.clock.advance(setup.control.builds.stale_after_s + 1)
    await setup.control.builds.settle_workspace(setup.ws)
    assert setup.control.builds.records.get(started.build_id).status == "error"
    assert "listed" not in [r.name for r in setup.registry.list_templates()]


async def test_a_live_build_is_refreshed_and_never_failed(setup: Setup) -> None:
    builds = setup.control.builds
    builds.heartbeat_s = 0.01
    setup.agent.build_gate = asyncio.Event()
    started = await builds.start_recipe_build(setup.ws, name="live", recipe=RECIPE, cpus=1, memory_mib=512)
    for _ in range(3):  # 120 s on the clock in all, never 60 without a heartbeat
        setup.clock.advance(40)
        async with asyncio.timeout(5):
            while builds.records.get(started.build_id).updated_at != setup.clock():
                await asyncio.sleep(0.01)
        assert (await builds.build(setup.ws, started.build_id)).status in ("waiting", "building")
    setup.agent.build_gate.set()
    assert (await setup.finished(started.build_id)).status == "ready"


async def test_a_reservation_waits_for_its_recipe_however_long(setup: Setup) -> None:
    builds = setup.control.builds
    reserved = await builds.reserve_build(setup.ws, name="later", cpus=None, memory_mib=None)
    setup.clock.advance(3600)
    assert (await builds.build(setup.ws, reserved.build_id)).status == "waiting"
    await setup.control.fleet.heartbeat(await heartbeat_of(setup.agent))
    started = await builds.start_recipe_build(
        setup.ws, name="later", recipe=RECIPE, cpus=1, memory_mib=512, build_id=reserved.build_id
    )
    assert started.updated_at == setup.clock()
    assert (await setup.finished(started.build_id)).status == "ready"
