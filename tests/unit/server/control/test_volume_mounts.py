"""Mounting volumes at create through the app with a fake agent: the agent is asked to attach them; one
writer or any number of readers (otherwise 409, and nothing is created); a failed create, a delete and a bad ask
leave no attachment; a snapshot records the mounts and a restore re-attaches them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cryobox.errors import HostUnavailable, VmmError
from cryobox.registry import Registry
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, app_env, registry
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture


@pytest.fixture
async def env(registry: Registry) -> AsyncIterator[Env]:
    async with app_env(registry, FakeAgent(name="a"), Quota()) as env:
        for name in ("data", "models"):
            made = await env.client.post("/v1/volumes", json={"name": name, "size_mb": 64})
            assert made.status_code == 201, made.text
        yield env


def attached(env: Env, name: str) -> list[tuple[str, str, bool]]:
    row = env.control.volumes.records.get(env.ws, name)
    return [(a.sandbox_id, a.path, a.read_only) for a in row.attachments]


def specs(env: Env) -> list[list[tuple[str, str, bool]]]:
    return [
        [(v.volume_id, v.path, v.read_only) for v in args[0].volumes] for m, args in env.agent.calls if m == "create"
    ]


async def test_one_writer_many_readers_and_a_delete_detaches(env: Env) -> None:
    data_id = env.control.volumes.records.get(env.ws, "data").id
    writer = await env.create(volumes=[{"name": "data", "path": "/work"}])
    assert writer.status_code == 201, writer.text
    assert specs(env) == [[(data_id, "/work", False)]]
    second = await env.create(volumes=[{"name": "data", "path": "/work"}])
    assert second.status_code == 409 and second.json()["details"]["writer"] == writer.json()["id"], second.text
    assert len(specs(env)) == 1  # the agent was never asked
    reader = await env.create(volumes=[{"name": "data", "readOnly": True}])
    assert reader.status_code == 409 and len(specs(env)) == 1  # not while it is written
    await env.client.delete(f"/v1/sandboxes/{writer.json()['id']}")
    readers = [await env.create(volumes=[{"name": "data", "readOnly": True}]) for _ in range(2)]
    assert [r.status_code for r in readers] == [201, 201]
    assert specs(env)[1:] == [[(data_id, "/mnt/data", True)]] * 2  # PandaStack's shape: no path
    assert [a[2] for a in attached(env, "data")] == [True, True]
    busy = await env.create(volumes=[{"name": "data", "path": "/work"}])
    assert busy.status_code == 409 and busy.json()["details"]["readers"] == sorted(r.json()["id"] for r in readers)
    for r in readers:
        await env.client.delete(f"/v1/sandboxes/{r.json()['id']}")
    again = await env.create(volumes=[{"name": "data", "path": "/work"}, {"name": "models", "path": "/models"}])
    assert again.status_code == 201, again.text


async def test_bad_asks_and_failed_creates_keep_no_attachment(env: Env) -> None:
    for volumes, status in (
        ([{"name": "nope", "path": "/x"}], 404),
        ([{"name": "data", "path": "relative"}], 400),
        ([{"name": "data", "path": "/proc/x"}], 400),
        ([{"name": "data", "path": "/a"}, {"name": "data", "path": "/b"}], 400),
        ([{"name": "data", "path": "/a/../b"}], 400),
        ([{"name": "data", "path": "/a", "size": 1}], 400),
    ):
        response = await env.create(volumes=volumes)
        assert response.status_code == status, (volumes, response.text)
    env.agent.fail_next["create"] = HostUnavailable("full")
    failed = await env.create(volumes=[{"name": "data", "path": "/work"}])
    assert failed.status_code == 503
    assert attached(env, "data") == [] and attached(env, "models") == []
    assert env.control.volumes.records.get(env.ws, "data").writer is None


async def test_a_snapshot_records_the_mounts_and_a_restore_reattaches_them(env: Env) -> None:
    data_id = env.control.volumes.records.get(env.ws, "data").id
    source = (await env.create(volumes=[{"name": "data", "path": "/work"}])).json()["id"]
    snap = await env.client.post(f"/v1/sandboxes/{source}/snapshots", json={"retain": True})
    assert snap.status_code == 201, snap.text
    row = env.registry.get_snapshot(snap.json()["id"])
    assert row.volumes == [{"volume_id": data_id, "name": "data", "path": "/work", "read_only": False}]
    busy = await env.create(from_snapshot=row.id)
    assert busy.status_code == 409  # its volume is written by the source still
    assert (await env.client.delete(f"/v1/sandboxes/{source}")).status_code == 204
    restored = await env.create(from_snapshot=row.id)
    assert restored.status_code == 201, restored.text
    assert specs(env)[-1] == [(data_id, "/work", False)]
    plain = await env.create(from_snapshot=row.id, volumes=[])  # asked for none: none
    assert plain.status_code == 201 and specs(env)[-1] == []


async def test_the_sandbox_view_names_its_mounts(env: Env) -> None:
    """A create's answer and ``GET /v1/sandboxes/{id}`` carry ``volumes``; a restore's shows the mounts it got
    back; a list does not read them (``null``)."""
    made = await env.create(volumes=[{"name": "data", "path": "/work"}, {"name": "models", "readOnly": True}])
    assert made.status_code == 201, made.text
    expected = [
        {"name": "data", "path": "/work", "read_only": False},
        {"name": "models", "path": "/mnt/models", "read_only": True},
    ]
    assert made.json()["volumes"] == expected
    sandbox_id = made.json()["id"]
    assert (await env.client.get(f"/v1/sandboxes/{sandbox_id}")).json()["volumes"] == expected
    bare = await env.made()
    assert (await env.client.get(f"/v1/sandboxes/{bare}")).json()["volumes"] == []
    listed = (await env.client.get("/v1/sandboxes")).json()["items"]
    assert {s["id"]: s["volumes"] for s in listed} == {sandbox_id: None, bare: None}
    snap = (await env.client.post(f"/v1/sandboxes/{sandbox_id}/snapshots", json={"retain": True})).json()["id"]
    assert (await env.client.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 204
    restored = await env.create(from_snapshot=snap)
    assert restored.status_code == 201 and restored.json()["volumes"] == expected, restored.text


async def test_restore_is_409_while_the_volumes_host_is_up(env: Env) -> None:
    response = await env.client.post("/v1/volumes/data/restore")
    assert response.status_code == 409 and "not lost" in response.text, response.text
    view = (await env.client.get("/v1/volumes/data")).json()
    assert (view["status"], view["stored_at"]) == ("ready", None)


async def test_a_delete_detaches_only_once_the_agent_has_killed_the_vm(env: Env) -> None:
    """Until the agent answers, its QEMU still holds the image's lock: a create or content call let in by the
    registry meanwhile would meet that lock instead of the registry's clear 409. A delete the agent fails still
    detaches (the sandbox has no row to detach it later)."""
    seen: list[list[tuple[str, str, bool]]] = []
    plain = env.agent.delete

    async def delete(sandbox_id: str) -> None:
        seen.append(attached(env, "data"))
        await plain(sandbox_id)

    env.agent.delete = delete  # type: ignore[method-assign]
    made = await env.create(volumes=[{"name": "data", "path": "/work"}])
    assert made.status_code == 201, made.text
    gone = await env.client.delete(f"/v1/sandboxes/{made.json()['id']}")
    assert gone.status_code == 204, gone.text
    assert seen == [[(made.json()["id"], "/work", False)]]  # still attached while the agent deleted it
    assert attached(env, "data") == []
    again = await env.create(volumes=[{"name": "data", "path": "/work"}])
    env.agent.fail_next["delete"] = VmmError("QEMU would not die")
    failed = await env.client.delete(f"/v1/sandboxes/{again.json()['id']}")
    assert failed.status_code >= 500 and attached(env, "data") == []
