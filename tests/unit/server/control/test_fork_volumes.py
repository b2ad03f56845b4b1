"""Fork children's volumes through the app with a fake agent: each child of ``fork_tree`` and ``fork`` gets a clone
of every read-write volume of its parent, a new volume named ``<volume>-<child id>`` registered and attached to it
read-write before the agent is asked, and every read-only volume attached read-only; the clones count against the
volume quotas first (429 with nothing made); a child that fails loses its clones (rows and images); a child deleted
later keeps its clone; a tree's snapshot records the parent's mounts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cryobox.agentapi import models as am
from cryobox.errors import HostUnavailable, StateError
from cryobox.registry import Registry
from cryobox.server.control.forkvolumes import clone_name
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, app_env, registry
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture
MIB = 1 << 20


async def _env(registry: Registry, quota: Quota) -> AsyncIterator[Env]:
    async with app_env(registry, FakeAgent(name="a"), quota) as env:
        for name in ("data", "models"):
            made = await env.client.post("/v1/volumes", json={"name": name, "size_mb": 64})
            assert made.status_code == 201, made.text
        yield env


@pytest.fixture
async def env(registry: Registry) -> AsyncIterator[Env]:
    async for env in _env(registry, Quota()):
        yield env


@pytest.fixture
async def tight(registry: Registry) -> AsyncIterator[Env]:
    """Room for one more 64 MiB volume only."""
    async for env in _env(registry, Quota(volumes=3, volume_bytes=192 * MIB)):
        yield env


async def _parent(env: Env) -> str:
    return await env.made(
        volumes=[{"name": "data", "path": "/work"}, {"name": "models", "path": "/models", "read_only": True}]
    )


def _names(env: Env) -> set[str]:
    return {row.name for row in env.control.volumes.records.list_volumes(env.ws)}


def _mounts(env: Env, sandbox_id: str) -> list[tuple[str, str, bool]]:
    return [(name, a.path, a.read_only) for a, name in env.control.volumes.records.mounts_of(sandbox_id)]


def test_a_clone_is_named_after_its_child_within_64_characters() -> None:
    assert clone_name("data", "sb-0123456789ab") == "data-sb-0123456789ab"
    long = clone_name("x" * 64, "sb-0123456789ab")
    assert len(long) == 64 and long.endswith("-sb-0123456789ab")


async def test_tree_children_get_clones_of_read_write_volumes_and_share_read_only_ones(env: Env) -> None:
    parent = await _parent(env)
    models_id = env.control.volumes.records.get(env.ws, "models").id
    tree = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 2})
    assert tree.status_code == 201, tree.text
    children = [c["id"] for c in tree.json()["children"]]
    assert len(children) == 2
    (_, request) = [args for name, args in env.agent.calls if name == "fork_tree"][-1]
    for child in children:
        clone = env.control.volumes.records.get(env.ws, f"data-{child}")
        assert clone.size_bytes == 64 * MIB and clone.host == "a" and clone.writer == child
        assert _mounts(env, child) == [(f"data-{child}", "/work", False), ("models", "/models", True)]
        assert [(v.volume_id, v.path, v.read_only, v.clone_of) for v in request.volumes[child]] == [
            (clone.id, "/work", False, env.control.volumes.records.get(env.ws, "data").id),
            (models_id, "/models", True, None),
        ]
        assert env.agent.volumes[clone.id] == 64 * MIB  # the agent made its image
    assert _mounts(env, parent) == [("data", "/work", False), ("models", "/models", True)]  # the parent keeps its own
    snap = env.registry.get_snapshot(tree.json()["snapshot_id"])
    assert [(v["name"], v["read_only"]) for v in snap.volumes] == [("data", False), ("models", True)]

    listed = await env.client.get("/v1/volumes")
    assert {v["name"] for v in listed.json()["items"]} == {"data", "models", *(f"data-{c}" for c in children)}
    assert (await env.client.delete(f"/v1/sandboxes/{children[0]}")).status_code == 204
    kept = env.control.volumes.records.get(env.ws, f"data-{children[0]}")  # data outlives sandboxes
    assert kept.attachments == () and kept.writer is None and kept.id in env.agent.volumes


async def test_a_tree_child_that_fails_loses_its_clone(env: Env) -> None:
    parent = await _parent(env)
    calls = len(env.agent.calls)

    original = env.agent.fork_tree

    async def failing_first(sandbox_id: str, request: am.TreeRequest) -> am.TreeResult:
        env.agent.failing_children = {request.child_ids[0]}
        return await original(sandbox_id, request)

    env.agent.fork_tree = failing_first  # type: ignore[method-assign]
    tree = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 2})
    assert tree.status_code == 201, tree.text
    body = tree.json()
    assert len(body["children"]) == 1 and [e["index"] for e in body["errors"]] == [0]
    survivor = body["children"][0]["id"]
    assert _names(env) == {"data", "models", f"data-{survivor}"}
    assert set(env.agent.volumes) == {r.id for r in env.control.volumes.records.list_volumes(env.ws)}
    assert env.agent.call_names()[calls:].count("delete_volume") == 1


async def test_quota_is_checked_first_and_a_refused_tree_makes_nothing(tight: Env) -> None:
    env = tight
    parent = await _parent(env)
    before = list(env.agent.calls)
    refused = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 2})
    assert refused.status_code == 429, refused.text
    assert refused.json()["details"]["resource"] in ("volumes", "volume_bytes")
    assert env.agent.calls == before and _names(env) == {"data", "models"}
    one = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 1})
    assert one.status_code == 201, one.text  # one clone fits


async def test_a_fork_child_gets_a_clone_and_a_failed_fork_leaves_none(env: Env) -> None:
    parent = await _parent(env)
    forked = await env.client.post(f"/v1/sandboxes/{parent}/fork", json={})
    assert forked.status_code == 201, forked.text
    child = forked.json()["sandbox"]["id"]
    (_, request) = [args for name, args in env.agent.calls if name == "fork"][-1]
    assert [(v.path, v.read_only, v.clone_of is not None) for v in request.volumes] == [
        ("/work", False, True),
        ("/models", True, False),
    ]
    assert _mounts(env, child) == [(f"data-{child}", "/work", False), ("models", "/models", True)]

    env.agent.fail_next["fork"] = HostUnavailable("full")
    failed = await env.client.post(f"/v1/sandboxes/{parent}/fork", json={})
    assert failed.status_code == 503
    assert _names(env) == {"data", "models", f"data-{child}"}
    assert set(env.agent.volumes) == {r.id for r in env.control.volumes.records.list_volumes(env.ws)}


async def test_a_parent_without_volumes_forks_as_before(env: Env) -> None:
    parent = await env.made()
    tree = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 2})
    assert tree.status_code == 201 and len(tree.json()["children"]) == 2
    (_, request) = [args for name, args in env.agent.calls if name == "fork_tree"][-1]
    assert request.volumes == {} and _names(env) == {"data", "models"}


async def test_a_busy_parent_is_a_409_and_leaves_no_clone(env: Env) -> None:
    parent = await _parent(env)
    busy = StateError("the volume at /work is in use", state="volume_busy", details={"path": "/work"})
    env.agent.fail_next["fork_tree"] = busy
    refused = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 2})
    assert refused.status_code == 409 and refused.json()["details"]["state"] == "volume_busy", refused.text
    assert _names(env) == {"data", "models"}
    models = env.control.volumes.records.get(env.ws, "models")
    assert [a.sandbox_id for a in models.attachments] == [parent]  # the children's read-only attachments went too
