"""``/v1/volumes`` through the app with a fake agent: create (201; a name once per workspace: 409), list, get,
grow (never shrink; not while attached), delete (not while attached); quotas (429) and bad bodies (400) change
nothing; a sandbox's delete detaches it and keeps the volume."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cryobox.registry import Registry
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, app_env, registry
from tests.support.fake_agent import FakeAgent

__all__ = ["registry"]  # the fixture
MIB = 1 << 20


@pytest.fixture
async def env(registry: Registry) -> AsyncIterator[Env]:
    async with app_env(registry, FakeAgent(name="a"), Quota(volumes=2, volume_bytes=3 << 30)) as env:
        yield env


async def test_create_list_get_grow_delete(env: Env) -> None:
    made = await env.client.post("/v1/volumes", json={"name": "data", "size_mb": 1024})
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["name"], body["size_mb"], body["size_bytes"], body["status"]) == ("data", 1024, 1 << 30, "ready")
    assert body["id"].startswith("vol-") and body["host"] == "a" and body["attached_to"] == []
    assert env.agent.volumes == {body["id"]: 1 << 30}
    [spec] = [args[0] for name, args in env.agent.calls if name == "create_volume"]
    assert spec.label == "fcvol-data"
    again = await env.client.post("/v1/volumes", json={"name": "data", "size_mb": 64})
    assert again.status_code == 409 and len(env.agent.volumes) == 1, again.text
    listed = (await env.client.get("/v1/volumes")).json()["items"]
    assert [v["name"] for v in listed] == ["data"]
    assert (await env.client.get("/v1/volumes/data")).json()["used_bytes"] == 4 << 20
    assert (await env.client.get("/v1/volumes/nope")).status_code == 404

    grown = await env.client.patch("/v1/volumes/data", json={"size_mb": 2048})
    assert grown.status_code == 200 and grown.json()["size_mb"] == 2048, grown.text
    shrunk = await env.client.patch("/v1/volumes/data", json={"size_mb": 512})
    assert shrunk.status_code == 400 and env.agent.volumes[body["id"]] == 2 << 30

    sandbox_id = await env.made()
    env.control.volumes.records.attach(body["id"], sandbox_id, "/data", read_only=False)
    assert (await env.client.delete("/v1/volumes/data")).status_code == 409
    assert (await env.client.patch("/v1/volumes/data", json={"size_mb": 2100})).status_code == 409
    attached = (await env.client.get("/v1/volumes/data")).json()["attached_to"]
    assert attached == [{"sandbox_id": sandbox_id, "path": "/data", "read_only": False}]
    assert (await env.client.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 204
    assert (await env.client.get("/v1/volumes/data")).json()["attached_to"] == []  # detached, kept
    assert (await env.client.delete("/v1/volumes/data")).status_code == 204
    assert env.agent.volumes == {} and (await env.client.get("/v1/volumes/data")).status_code == 404


async def test_quotas_and_bad_bodies_change_nothing(env: Env) -> None:
    assert (await env.client.post("/v1/volumes", json={"name": "a", "size_mb": 2048})).status_code == 201
    too_big = await env.client.post("/v1/volumes", json={"name": "b", "size_mb": 2048})
    assert too_big.status_code == 429 and too_big.json()["details"]["resource"] == "volume_bytes", too_big.text
    assert (await env.client.post("/v1/volumes", json={"name": "b", "size_mb": 512})).status_code == 201
    third = await env.client.post("/v1/volumes", json={"name": "c", "size_mb": 16})
    assert third.status_code == 429 and third.json()["details"]["resource"] == "volumes"
    grow = await env.client.patch("/v1/volumes/b", json={"size_mb": 2048})
    assert grow.status_code == 429 and grow.json()["details"]["resource"] == "volume_bytes"
    for bad in (
        {"name": "../x", "size_mb": 64},
        {"name": "ok", "size_mb": 1},
        {"name": "ok", "size_mb": 64, "filesystem": "xfs"},
        {"size_mb": 64},
    ):
        response = await env.client.post("/v1/volumes", json=bad)
        assert response.status_code == 400, (bad, response.text)
    assert sorted(env.agent.volumes.values()) == [512 * MIB, 2048 * MIB]
    quota = (await env.client.get("/v1/quota")).json()
    assert (quota["usage"]["volumes"], quota["usage"]["volume_bytes"]) == (2, 2560 * MIB)
    assert (quota["limits"]["volumes"], quota["limits"]["volume_bytes"]) == (2, 3 << 30)
