"""POST routes whose request has only optional fields treat a missing or empty body as "all defaults" (the
unchanged ``pandastack`` SDK POSTs snapshot and fork with no body); a body that is not an object is still a 400."""

from __future__ import annotations

import httpx

from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures

JSON = {"Content-Type": "application/json"}


async def test_missing_and_empty_bodies_mean_all_defaults(env: Env) -> None:
    for empty in ({}, {"content": b"", "headers": JSON}):  # no body at all, or an empty one
        made = await env.client.post("/v1/sandboxes", **empty)  # type: ignore[arg-type]
        # the default template was asked for (this fake agent serves only base), not "body: Field required"
        assert made.status_code == 404, made.text
        assert made.json()["details"] == {"template": "code-interpreter"}
    parent = await env.made()

    snap = await env.client.post(f"/v1/sandboxes/{parent}/snapshots")
    assert snap.status_code == 201, snap.text
    assert snap.json()["sandbox_id"] == parent

    fork = await env.client.post(f"/v1/sandboxes/{parent}/fork", content=b"", headers=JSON)
    assert fork.status_code == 201, fork.text
    tree = await env.client.post(f"/v1/sandboxes/{parent}/fork-tree")
    assert tree.status_code == 201, tree.text
    assert env.calls("create") == 1 and env.calls("fork") == 1 and env.calls("fork_tree") == 1


async def test_a_body_that_is_not_an_object_is_still_refused(env: Env) -> None:
    before = env.calls("create")
    for content in (b"null", b"[]", b"3", b"{"):
        response = await env.client.post("/v1/sandboxes", content=content, headers=JSON)
        assert response.status_code == 400, (content, response.text)
    assert env.calls("create") == before  # nothing was created
    refused: httpx.Response = await env.client.post("/v1/snapshots/import")  # a required field: still 400
    assert refused.status_code == 400, refused.text
