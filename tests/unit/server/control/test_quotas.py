"""Per-workspace quotas in the control plane, over an in-process fake agent on a real (SQLite) registry: every way
a sandbox comes to exist (create, restore, fork, fork tree, wake) is admitted by one guard before anything is
reserved on an agent; past a limit the answer is 429 ``quota_exceeded`` and nothing is created. Also snapshot
bytes, custom templates, TTL defaults and maximum, and ``GET /v1/quota``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cryobox.agentapi import models as am
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import wire_registration
from cryobox.errors import NotFound, WorkspaceQuotaExceeded
from cryobox.registry import Registry
from cryobox.sdk._base import capacity_retry_after, error_from_response
from cryobox.server.control.createrequest import CreateRequest
from cryobox.server.control.fleet import FleetConfig
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, agent, env, limits, quota, registry
from tests.support.control import control_plane
from tests.support.fake_agent import FakeAgent

__all__ = ["agent", "env", "quota", "registry"]  # fixtures


class SlowAgent(FakeAgent):
    """Creates take a moment, so concurrent ones are all in flight together."""

    async def create(self, spec: am.CreateSpec) -> am.SandboxInfo:
        await asyncio.sleep(0.05)
        return await super().create(spec)


def refused(response: httpx.Response, resource: str, limit: int, used: int, requested: int) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["code"] == "quota_exceeded" and body["error"]
    assert body["details"] == {"resource": resource, "limit": limit, "used": used, "requested": requested}
    assert "retry-after" not in response.headers  # waiting does not help: the SDK does not retry it


# -- sandboxes ---------------------------------------------------------------------------------------------------


@limits(sandboxes=2)
async def test_a_create_over_the_sandbox_quota_is_429_and_creates_nothing(env: Env) -> None:
    for _ in range(2):
        await env.made()
    refused(await env.create(), "sandboxes", 2, 2, 1)
    assert env.rows() == 2 and env.calls("create") == 2  # no row, no agent call
    assert env.registry.fleet.reservations() == []
    other = env.registry.ensure_workspace("beta").id  # another workspace has its own quota
    await env.control.create(CreateRequest("base", other, {}, {}, None, False))
    # a restore from a snapshot is a create like any other
    snap = await env.client.post(f"/v1/sandboxes/{env.registry.list_sandboxes(env.ws)[0].id}/snapshots", json={})
    assert snap.status_code == 201, snap.text
    refused(await env.create(from_snapshot=snap.json()["id"]), "sandboxes", 2, 2, 1)
    assert env.calls("create") == 3


@limits(vcpus=3, memory_mib=1024)
async def test_memory_and_vcpus_are_counted_per_sandbox(env: Env) -> None:
    await env.made()
    await env.made()
    refused(await env.create(), "memory_mib", 1024, 1024, 512)
    assert env.rows() == 2 and env.calls("create") == 2


@limits(sandboxes=3)
async def test_concurrent_creates_at_the_boundary_admit_exactly_the_quota(registry: Registry, quota: Quota) -> None:
    agent = SlowAgent(name="a", max_sandboxes=64, memory_mib=1 << 20)
    control = control_plane(registry, {"a": agent}, config=FleetConfig(deadline_s=10.0), quota=quota)
    guard, fleet = control.quotas, control.fleet
    wire_registration(control)  # the agent's templates get their rows
    await fleet.heartbeat(await heartbeat_of(agent))
    ws = registry.ensure_workspace("alpha").id
    request = CreateRequest("base", ws, {}, {}, None, False)
    results = await asyncio.gather(*(control.create(request) for _ in range(8)), return_exceptions=True)
    made = [r for r in results if not isinstance(r, BaseException)]
    assert len(made) == 3 and all(isinstance(r, WorkspaceQuotaExceeded) for r in results if r not in made)
    assert len(registry.list_sandboxes(ws)) == 3 and agent.call_names().count("create") == 3
    assert guard._claims == {}  # every admission released
    await control.delete(made[0].id, ws)  # a slot frees up
    await control.create(request)
    await fleet.close()


@limits(vcpus=4)
async def test_a_fork_tree_that_does_not_fit_is_refused_whole(env: Env) -> None:
    parent = await env.made()
    tree = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 4})
    refused(tree, "vcpus", 4, 1, 4)
    assert env.calls("fork_tree") == 0 and env.rows() == 1  # nothing captured, reserved or created
    assert env.registry.list_snapshots(env.ws) == [] and env.registry.fleet.reservations() == []
    tree = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 3})
    assert tree.status_code == 201, tree.text
    assert len(tree.json()["children"]) == 3 and env.rows() == 4
    refused(await env.client.post(f"/v1/sandboxes/{parent}/fork", json={}), "vcpus", 4, 4, 1)
    assert env.calls("fork") == 0


@limits(sandboxes=2)
async def test_a_fork_counts_as_a_sandbox(env: Env) -> None:
    parent = await env.made()
    fork = await env.client.post(f"/v1/sandboxes/{parent}/fork", json={})
    assert fork.status_code == 201, fork.text
    refused(await env.client.post(f"/v1/sandboxes/{parent}/fork", json={}), "sandboxes", 2, 2, 1)
    refused(await env.client.post(f"/v1/sandboxes/{parent}/fork-tree", json={"count": 1}), "sandboxes", 2, 2, 1)
    assert env.calls("fork") == 1 and env.calls("fork_tree") == 0


@limits(sandboxes=3, vcpus=2)
async def test_a_wake_needs_room_for_the_vcpus_and_memory_again(env: Env) -> None:
    first, sleeper = await env.made(), await env.made()
    hibernated = await env.client.post(f"/v1/sandboxes/{sleeper}/hibernate")
    assert hibernated.json() == {"status": "hibernated"}
    third = await env.made()  # the hibernated one holds no vCPUs: room for another
    quota = (await env.client.get("/v1/quota")).json()
    assert quota["usage"] == {
        "sandboxes": 2,
        "vcpus": 2,
        "memory_mib": 1024,
        "snapshot_bytes": 0,
        "templates": 0,
        "hibernated": 1,
        "volumes": 0,
        "volume_bytes": 0,
    }
    refused(await env.client.post(f"/v1/sandboxes/{sleeper}/wake"), "vcpus", 2, 2, 1)
    exec_ = await env.client.post(f"/v1/sandboxes/{sleeper}/exec", json={"cmd": "echo hi"})  # any request wakes it
    refused(exec_, "vcpus", 2, 2, 1)
    assert env.calls("wake") == 0 and env.calls("exec") == 0
    assert env.registry.get_sandbox(sleeper).status == "hibernated"
    lifecycle = await env.client.get(f"/v1/sandboxes/{sleeper}/lifecycle")  # reads do not wake it
    assert lifecycle.status_code == 200
    assert (await env.client.delete(f"/v1/sandboxes/{third}")).status_code == 204
    exec_ = await env.client.post(f"/v1/sandboxes/{sleeper}/exec", json={"cmd": "echo hi"})
    assert exec_.status_code == 200 and exec_.json()["stdout"] == "hi\n"
    assert env.registry.get_sandbox(sleeper).status == "running" and env.calls("wake") == 1
    assert {first, sleeper} == {r.id for r in env.registry.list_sandboxes(env.ws)}


# -- TTL ---------------------------------------------------------------------------------------------------------


async def test_without_a_default_ttl_sandboxes_never_expire(env: Env) -> None:
    sandbox = await env.made()
    assert (await env.client.get(f"/v1/sandboxes/{sandbox}/lifecycle")).json()["ttl_seconds"] is None


@limits(default_ttl_s=600, max_ttl_s=3600)
async def test_the_default_ttl_is_applied_and_a_longer_one_than_the_max_refused(env: Env) -> None:
    default, short, pinned = await env.made(), await env.made(ttl_seconds=100), await env.made(persistent=True)
    assert env.ttls() == {default: 600, short: 100, pinned: None}
    assert (await env.client.get(f"/v1/sandboxes/{default}/lifecycle")).json()["ttl_seconds"] == 600
    too_long = await env.create(ttl_seconds=7200)
    assert too_long.status_code == 400 and too_long.json()["code"] == "invalid_argument"
    assert too_long.json()["details"] == {"ttl_seconds": 7200, "max_ttl_seconds": 3600}
    patched = await env.client.patch(f"/v1/sandboxes/{default}/lifecycle", json={"ttl_seconds": 7200})
    assert patched.status_code == 400
    assert env.calls("create") == 3 and env.calls("set_lifecycle") == 0
    env.records.set(env.ws, max_ttl_s=10_000, default_ttl_s=0)  # the workspace's own: longer, and no default
    longer, plain = await env.made(ttl_seconds=7200), await env.made()
    assert (env.ttls()[longer], env.ttls()[plain]) == (7200, None)


@limits(default_ttl_s=600, max_ttl_s=3600)
async def test_limits_changed_by_another_replica_decide_the_ttl_of_the_next_create(env: Env) -> None:
    """A create checks its TTL first by the limits this replica last read (no read of its own); its admission
    reads them again, and those decide. Here they are changed in the registry, as another replica would."""
    first = await env.made()
    assert env.ttls()[first] == 600  # this replica has read the workspace's limits
    env.records.set(env.ws, max_ttl_s=1000, default_ttl_s=60)  # lowered elsewhere
    above = await env.create(ttl_seconds=2000)  # allowed by what this replica saw last, not by the registry
    assert above.status_code == 400 and above.json()["details"] == {"ttl_seconds": 2000, "max_ttl_seconds": 1000}
    assert env.calls("create") == 1  # refused before any restore
    plain = await env.made()
    assert env.ttls()[plain] == 60  # the new default, not the one seen before
    assert len(env.registry.list_sandboxes(env.ws)) == 2  # the refused create left nothing


# -- snapshots and templates -------------------------------------------------------------------------------------


@limits(snapshot_bytes=600 << 20)
async def test_new_snapshots_are_refused_once_the_workspace_holds_its_snapshot_bytes(env: Env) -> None:
    sandbox = await env.made()
    first = await env.client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={})
    assert first.status_code == 201, first.text  # 0 bytes used: it may take the workspace past its quota
    used = first.json()["size_bytes"]
    assert used >= 512 << 20
    second = await env.client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={})
    assert second.status_code == 201  # still under
    refused(
        await env.client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={}), "snapshot_bytes", 600 << 20, 2 * used, 0
    )
    tree = await env.client.post(f"/v1/sandboxes/{sandbox}/fork-tree", json={"count": 1})  # its capture is one too
    refused(tree, "snapshot_bytes", 600 << 20, 2 * used, 0)
    assert env.calls("snapshot") == 2 and env.calls("fork_tree") == 0
    assert (await env.client.delete(f"/v1/snapshots/{first.json()['id']}")).status_code == 204
    assert (await env.client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={})).status_code == 201


@limits(templates=1)
async def test_a_new_custom_template_past_the_quota_is_refused(env: Env) -> None:
    built = await env.client.post("/v1/templates", json={"name": "mine"})
    assert built.status_code == 202, built.text
    refused(await env.client.post("/v1/templates", json={"name": "other"}), "templates", 1, 1, 1)
    for _ in range(200):  # the build finishes in the background
        if env.control.templates.progress.get("mine") == "ready":
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # and its job is gone
    again = await env.client.post("/v1/templates", json={"name": "mine"})  # a rebuild adds no template
    assert again.status_code == 202, again.text
    for _ in range(200):
        if env.calls("build_template") == 2:
            break
        await asyncio.sleep(0.01)
    assert env.calls("build_template") == 2
    with pytest.raises(NotFound):
        env.registry.get_template("other")


# -- the route, overrides, the SDK -------------------------------------------------------------------------------


@limits(sandboxes=5, default_ttl_s=300)
async def test_get_quota_shows_limits_and_usage_and_overrides_change_them(env: Env) -> None:
    assert (await env.client.get("/v1/quota", headers={"Authorization": "Bearer nope"})).status_code == 401
    await env.made()
    body = (await env.client.get("/v1/quota")).json()
    assert body["workspace"] == "alpha" and body["workspace_id"] == env.ws
    assert body["limits"] == {
        "sandboxes": 5,
        "vcpus": 64,
        "memory_mib": 32768,
        "snapshot_bytes": 50 << 30,
        "templates": 20,
        "default_ttl_s": 300,
        "max_ttl_s": 30 * 24 * 3600,
        "hibernated": 100,
        "paused_retention_s": 30 * 24 * 3600.0,
        "volumes": 20,
        "volume_bytes": 100 << 30,
    }
    assert body["usage"] == {
        "sandboxes": 1,
        "vcpus": 1,
        "memory_mib": 512,
        "snapshot_bytes": 0,
        "templates": 0,
        "hibernated": 0,
        "volumes": 0,
        "volume_bytes": 0,
    }
    env.records.set(env.ws, sandboxes=1, vcpus=8)
    body = (await env.client.get("/v1/quota")).json()
    assert (body["limits"]["sandboxes"], body["limits"]["vcpus"]) == (1, 8)
    refused(await env.create(), "sandboxes", 1, 1, 1)
    env.records.clear(env.ws)
    assert (await env.client.get("/v1/quota")).json()["limits"]["sandboxes"] == 5
    await env.made()


def test_the_sdk_maps_quota_exceeded_and_does_not_retry_it() -> None:
    response = httpx.Response(
        429, json={"error": "full", "code": "quota_exceeded", "details": {"resource": "sandboxes"}}
    )
    error = error_from_response(response)
    assert isinstance(error, WorkspaceQuotaExceeded) and error.details == {"resource": "sandboxes"}
    assert capacity_retry_after(response) is None
