"""Recipe builds in the control plane (``control.builds``): context blobs, build records and logs in the registry,
first builds that fail leave no template, rebuilds that fail leave the old one serving, refusals write nothing,
rebuilds on agents that register later, context blobs dropped with the last template naming them."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from cryobox.agentapi import models as am
from cryobox.errors import BuildQueueFull, InvalidArgument, NotFound, PayloadTooLarge, StateError
from cryobox.image.recipe.model import Base, Recipe, Step
from cryobox.objstore import keys
from cryobox.registry import Registry, SnapshotRow
from cryobox.registry.builds import BuildLogEntry, BuildRecord, BuildRecords
from tests.support import recipebuilds
from tests.support import registry as registry_support
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent
from tests.support.recipebuilds import Setup

registry = registry_support.sqlite_registry
clock = registry_support.clock


setup = recipebuilds.setup


async def test_a_context_blob_is_stored_under_its_sha256_and_a_too_large_one_is_refused(setup: Setup) -> None:
    blob = await setup.control.builds.put_context(setup.ws, b"tar bytes")
    assert blob == hashlib.sha256(b"tar bytes").hexdigest()
    assert setup.objects.get(keys.build_context(blob)) == b"tar bytes"
    setup.control.builds.max_context_bytes = 4
    with pytest.raises(PayloadTooLarge):
        await setup.control.builds.put_context(setup.ws, b"12345")
    assert not setup.objects.exists(keys.build_context(hashlib.sha256(b"12345").hexdigest()))


async def test_a_build_runs_the_recipe_and_keeps_its_log_lines_in_order(setup: Setup) -> None:
    blob = await setup.control.builds.put_context(setup.ws, b"ctx")
    setup.agent.recipe_log_lines = 2
    started = await setup.control.builds.start_recipe_build(
        setup.ws, name="my-tpl", recipe=setup.recipe(blob), cpus=2, memory_mib=1024, tags=["v1"]
    )
    assert started.status == "waiting" and started.tags == ("v1",)
    assert setup.registry.get_template("my-tpl").status == "building"
    done = await setup.finished(started.build_id)
    assert done.status == "ready" and done.error is None and done.finished_at == setup.clock()
    row = setup.registry.get_template("my-tpl")
    assert (row.status, row.cpus, row.memory_mib) == ("ready", 2, 1024)
    assert row.spec is not None and row.spec["build"]["recipe"]["steps"][0]["context"] == blob
    (build,) = [args[0] for method, args in setup.agent.calls if method == "build_template"]
    assert isinstance(build, am.TemplateBuild) and Recipe.from_json(build.spec.recipe or {}) == setup.recipe(blob)
    assert setup.agent.build_contexts == {blob: b"ctx"}
    logs = await setup.control.builds.build_logs(setup.ws, started.build_id, 0, 100)
    assert [e.offset for e in logs] == list(range(10))
    assert [e.step for e in logs] == ["base", "base", "1", "1", "2", "2", "3", "3", "finalize", "finalize"]
    assert logs[2].message == "COPY app /app [0]"
    page = await setup.control.builds.build_logs(setup.ws, started.build_id, 8, 5)
    assert [e.offset for e in page] == [8, 9]
    assert await setup.control.builds.build_logs(setup.ws, started.build_id, 10, 5) == []
    assert (await setup.control.builds.latest_build(setup.ws, "my-tpl")) == done


async def test_a_failed_first_build_leaves_no_template_and_keeps_the_error(setup: Setup) -> None:
    blob = await setup.control.builds.put_context(setup.ws, b"ctx")
    setup.agent.recipe_fail_step = "2"
    started = await setup.control.builds.start_recipe_build(
        setup.ws, name="broken", recipe=setup.recipe(blob), cpus=None, memory_mib=None
    )
    done = await setup.finished(started.build_id)
    assert (done.status, done.error_step) == ("error", "2")
    assert done.error == "step 2 failed: exit status 1"
    with pytest.raises(NotFound):
        setup.registry.get_template("broken")
    logs = await setup.control.builds.build_logs(setup.ws, started.build_id, 0, 100, level="error")
    assert [(e.message, e.step) for e in logs] == [("step 2 failed: exit status 1", "2")]


async def test_a_failed_rebuild_keeps_the_previous_template_serving(setup: Setup) -> None:
    blob = await setup.control.builds.put_context(setup.ws, b"ctx")
    first = await setup.control.builds.start_recipe_build(
        setup.ws, name="svc", recipe=setup.recipe(blob), cpus=1, memory_mib=512
    )
    await setup.finished(first.build_id)
    before = setup.registry.get_template("svc")
    setup.agent.recipe_fail_step = "finalize"
    again = await setup.control.builds.start_recipe_build(
        setup.ws, name="svc", recipe=setup.recipe(blob), cpus=1, memory_mib=512
    )
    assert setup.registry.get_template("svc").status == "ready"  # serving while it rebuilds
    done = await setup.finished(again.build_id)
    assert (done.status, done.error_step) == ("error", "finalize")
    assert setup.registry.get_template("svc") == before
    assert (await setup.control.builds.latest_build(setup.ws, "svc")) == done


async def test_refusals_write_nothing(setup: Setup) -> None:
    builds = setup.control.builds
    missing = "0" * 64
    with pytest.raises(InvalidArgument) as never_uploaded:
        await builds.start_recipe_build(setup.ws, name="t", recipe=setup.recipe(missing), cpus=1, memory_mib=512)
    assert never_uploaded.value.details == {"hash": missing}
    with pytest.raises(InvalidArgument):
        await builds.start_recipe_build(
            setup.ws, name="Bad_Name", recipe=Recipe(Base("debian", "x")), cpus=1, memory_mib=1
        )
    with pytest.raises(InvalidArgument):
        await builds.start_recipe_build(setup.ws, name="t", recipe=Recipe(Base("debian", "x")), cpus=99, memory_mib=512)
    with pytest.raises(InvalidArgument):  # a built-in's name is taken
        await builds.start_recipe_build(
            setup.ws, name="base", recipe=Recipe(Base("debian", "x")), cpus=1, memory_mib=512
        )
    assert await builds.latest_build(setup.ws, "t") is None
    assert [r.name for r in setup.registry.list_templates()] == ["base"]
    assert setup.agent.call_names().count("build_template") == 0


async def test_the_per_agent_bound_and_a_second_build_of_one_name_are_refused(setup: Setup) -> None:
    builds = setup.control.builds
    setup.control.templates.max_builds = 1
    setup.agent.build_gate = asyncio.Event()
    recipe = Recipe(Base("debian", "bookworm"), (Step("RUN", ("true",)),))
    held = await builds.start_recipe_build(setup.ws, name="one", recipe=recipe, cpus=1, memory_mib=512)
    with pytest.raises(StateError):
        await builds.start_recipe_build(setup.ws, name="one", recipe=recipe, cpus=1, memory_mib=512)
    with pytest.raises(BuildQueueFull) as full:
        await builds.start_recipe_build(setup.ws, name="two", recipe=recipe, cpus=1, memory_mib=512)
    assert full.value.http_status == 429
    assert await builds.latest_build(setup.ws, "two") is None
    with pytest.raises(NotFound):
        setup.registry.get_template("two")
    setup.agent.build_gate.set()
    assert (await setup.finished(held.build_id)).status == "ready"


async def test_builds_survive_a_restart_and_rebuild_on_a_later_agent(setup: Setup) -> None:
    blob = await setup.control.builds.put_context(setup.ws, b"ctx")
    started = await setup.control.builds.start_recipe_build(
        setup.ws, name="kept", recipe=setup.recipe(blob), cpus=1, memory_mib=512
    )
    await setup.finished(started.build_id)
    replica = control_plane(setup.registry, {}, clock=setup.clock, objects=setup.objects)
    try:
        assert (await replica.builds.build(setup.ws, started.build_id)).status == "ready"
        assert len(await replica.builds.build_logs(setup.ws, started.build_id, 0, 100)) == 5
        other = setup.registry.ensure_workspace("beta").id
        with pytest.raises(NotFound):
            await replica.builds.build(other, started.build_id)
        late = FakeAgent(name="b", clock=setup.clock, objects=setup.objects)
        await replica.templates.agent_registered("b", late, {})
        async with asyncio.timeout(5):
            while replica.templates.building("kept"):
                await asyncio.sleep(0.01)
        (build,) = [args[0] for method, args in late.calls if method == "build_template"]
        assert Recipe.from_json(build.spec.recipe or {}) == setup.recipe(blob)
        assert "kept" in late.template_infos
    finally:
        await close_control(replica)


async def test_deleting_a_template_drops_the_context_blobs_no_other_template_names(setup: Setup) -> None:
    builds = setup.control.builds
    shared = await builds.put_context(setup.ws, b"shared")
    own = await builds.put_context(setup.ws, b"own")
    await builds.record_file(setup.ws, "sdk-hash", own, "one")
    for name, blobs in (("one", (shared, own)), ("two", (shared,))):
        steps = tuple(Step("COPY", ("x", "/x"), context=b) for b in blobs)
        started = await builds.start_recipe_build(
            setup.ws, name=name, recipe=Recipe(Base("debian", "bookworm"), steps), cpus=1, memory_mib=512
        )
        await setup.finished(started.build_id)
    assert await builds.file_blob(setup.ws, "sdk-hash") == own
    await setup.control.templates.delete("one", setup.ws)
    assert setup.objects.exists(keys.build_context(shared))
    assert not setup.objects.exists(keys.build_context(own))
    assert await builds.file_blob(setup.ws, "sdk-hash") is None


def test_log_lines_are_capped_with_a_marker(registry: Registry) -> None:
    records = BuildRecords(registry.database)
    ws = registry.ensure_workspace("alpha").id
    records.add(BuildRecord("b1", "t", ws, "building", 1.0))
    lines = [BuildLogEntry(0, 2.0, "info", f"line {n}", "1") for n in range(5)]
    assert records.append_logs("b1", lines[:2], limit=3) == 2
    assert records.append_logs("b1", lines[2:], limit=3) == 4
    assert records.append_logs("b1", lines, limit=3) == 4
    kept = records.logs("b1", 0, 100)
    assert [e.message for e in kept] == ["line 0", "line 1", "line 2", "log truncated after 3 lines"]
    assert [e.offset for e in kept] == [0, 1, 2, 3]


async def test_deleting_a_template_drops_its_published_generations_unless_a_snapshot_needs_them(setup: Setup) -> None:
    builds = setup.control.builds
    for name in ("gone", "kept"):
        started = await builds.start_recipe_build(
            setup.ws, name=name, recipe=Recipe(Base("debian", "bookworm")), cpus=1, memory_mib=512
        )
        await setup.finished(started.build_id)
        for key in (f"templates/{name}/g1/manifest.json", f"templates/{name}/g1/vmstate", f"templates/{name}/latest"):
            setup.objects.put(key, b"{}")
    setup.control.registry.add_snapshot(SnapshotRow(id="snap-1", workspace_id=setup.ws, template="kept", path=""))
    await setup.control.templates.delete("gone", setup.ws)
    await setup.control.templates.delete("kept", setup.ws)
    assert setup.objects.list("templates/gone/") == []  # the chunks go with `cryobox gc --store`
    assert len(setup.objects.list("templates/kept/")) == 3  # a snapshot of it may restore on another host
