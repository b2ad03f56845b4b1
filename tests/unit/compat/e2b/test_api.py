"""The E2B control-plane API under ``/e2b`` against a fake agent: shapes the pinned ``e2b`` SDK parses, its
error shape and status codes, and that each call does what it says on the agent (and nothing on bad input)."""

from __future__ import annotations

import urllib.parse

import httpx

from cryobox.compat.e2b.access import PURPOSE
from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures


def e2b(env: Env) -> dict[str, str]:
    key = env.client.headers["Authorization"].split()[1]
    return {"X-API-Key": key, "Authorization": ""}


async def create(env: Env, **body: object) -> httpx.Response:
    return await env.client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body}, headers=e2b(env))


async def test_create_get_list_kill(env: Env) -> None:
    made = await create(env, metadata={"app": "e2b", "n": "1"}, envVars={"X": "1"}, timeout=120)
    assert made.status_code == 201, made.text
    body = made.json()
    sid = body["sandboxID"]
    assert body["templateID"] == "base" and body["envdVersion"] == "0.6.4"
    assert env.control.registry.sealer.verify_mac(PURPOSE, sid, body["envdAccessToken"])
    assert env.agent.sandboxes[sid].env == {"X": "1"} and env.agent.sandboxes[sid].ttl_s == 120
    detail = (await env.client.get(f"/e2b/sandboxes/{sid}", headers=e2b(env))).json()
    assert detail["state"] == "running" and detail["metadata"] == {"app": "e2b", "n": "1"}
    assert detail["envdAccessToken"] == body["envdAccessToken"] and detail["cpuCount"] >= 1
    other = (await create(env, metadata={"app": "other"})).json()["sandboxID"]

    query = urllib.parse.urlencode({"app": "e2b"})
    listed = await env.client.get("/e2b/v2/sandboxes", params={"metadata": query}, headers=e2b(env))
    assert [s["sandboxID"] for s in listed.json()] == [sid]
    assert listed.headers["X-Total-Running"] == "1"
    page = await env.client.get("/e2b/v2/sandboxes", params={"limit": 1}, headers=e2b(env))
    assert len(page.json()) == 1 and page.headers.get("X-Next-Token")
    rest = await env.client.get(
        "/e2b/v2/sandboxes", params={"limit": 1, "nextToken": page.headers["X-Next-Token"]}, headers=e2b(env)
    )
    assert {page.json()[0]["sandboxID"], rest.json()[0]["sandboxID"]} == {sid, other}
    assert "X-Next-Token" not in rest.headers

    assert (await env.client.delete(f"/e2b/sandboxes/{sid}", headers=e2b(env))).status_code == 204
    gone = await env.client.get(f"/e2b/sandboxes/{sid}", headers=e2b(env))
    assert gone.status_code == 404 and gone.json()["code"] == 404 and gone.json()["message"]
    assert (await env.client.delete(f"/e2b/sandboxes/{sid}", headers=e2b(env))).status_code == 404


async def test_errors_are_in_e2b_shape_and_change_nothing(env: Env) -> None:
    before = env.calls("create")
    unauth = await env.client.post("/e2b/v2/sandboxes", json={}, headers={"Authorization": "", "X-API-Key": "bad"})
    assert unauth.status_code == 401 and unauth.json() == {"code": 401, "message": "invalid or revoked API key"}
    bad = await create(env, timeout=-5)
    assert bad.status_code == 400 and bad.json()["code"] == 400 and "timeout" in bad.json()["message"]
    missing = await create(env, templateID="no-such-template")
    assert missing.status_code == 404 and missing.json()["code"] == 404
    assert env.calls("create") == before
    bad_state = await env.client.get("/e2b/v2/sandboxes", params={"state": "exploded"}, headers=e2b(env))
    assert bad_state.status_code == 400
    bad_token = await env.client.get("/e2b/v2/sandboxes", params={"nextToken": "!!"}, headers=e2b(env))
    assert bad_token.status_code == 400


async def test_timeout_pause_connect(env: Env) -> None:
    sid = (await create(env)).json()["sandboxID"]
    assert env.agent.sandboxes[sid].ttl_s == 300  # E2B's default
    r = await env.client.post(f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 900}, headers=e2b(env))
    assert r.status_code == 204 and env.agent.sandboxes[sid].ttl_s == 900
    assert (await env.client.post(f"/e2b/sandboxes/{sid}/pause", headers=e2b(env))).status_code == 204
    assert env.agent.sandboxes[sid].state == "hibernated"
    detail = (await env.client.get(f"/e2b/sandboxes/{sid}", headers=e2b(env))).json()
    assert detail["state"] == "paused"
    again = await env.client.post(f"/e2b/sandboxes/{sid}/pause", headers=e2b(env))
    assert again.status_code == 409  # the SDK reads "already paused"
    paused = await env.client.get("/e2b/v2/sandboxes", params={"state": "paused"}, headers=e2b(env))
    assert [s["sandboxID"] for s in paused.json()] == [sid]
    woke = await env.client.post(f"/e2b/v2/sandboxes/{sid}/connect", json={"timeout": 60}, headers=e2b(env))
    assert woke.status_code == 201 and env.agent.sandboxes[sid].state == "running"
    assert env.agent.sandboxes[sid].ttl_s == 900  # connect only extends
    running = await env.client.post(f"/e2b/v2/sandboxes/{sid}/connect", json={"timeout": 2000}, headers=e2b(env))
    assert running.status_code == 200 and env.agent.sandboxes[sid].ttl_s == 2000
    assert running.json()["envdAccessToken"] == woke.json()["envdAccessToken"]


async def test_fork_and_snapshots(env: Env) -> None:
    sid = (await create(env, metadata={"who": "parent"})).json()["sandboxID"]
    forks = await env.client.post(f"/e2b/sandboxes/{sid}/fork", json={"count": 2}, headers=e2b(env))
    assert forks.status_code == 201, forks.text
    children = [f["sandbox"]["sandboxID"] for f in forks.json()]
    assert len(set(children)) == 2 and sid not in children and env.calls("fork_tree") == 1
    snap = await env.client.post(f"/e2b/sandboxes/{sid}/snapshots", json={"name": "mine"}, headers=e2b(env))
    assert snap.status_code == 201 and snap.json()["names"] == ["mine"]
    snap_id = snap.json()["snapshotID"]
    listed = await env.client.get("/e2b/snapshots", params={"sandboxID": sid}, headers=e2b(env))
    assert snap_id in [s["snapshotID"] for s in listed.json()]
    by_id = await create(env, templateID=snap_id)
    by_name = await create(env, templateID="mine")
    assert by_id.status_code == by_name.status_code == 201
    for made in (by_id, by_name):
        restored = env.agent.sandboxes[made.json()["sandboxID"]]
        assert restored.from_snapshot == snap_id
    assert (await env.client.delete(f"/e2b/templates/{snap_id}", headers=e2b(env))).status_code == 204
    assert (await env.client.delete(f"/e2b/templates/{snap_id}", headers=e2b(env))).status_code == 404


async def test_the_sandbox_url_needs_the_sandbox_token_before_anything_runs(env: Env) -> None:
    made = (await create(env)).json()
    sid, token = made["sandboxID"], made["envdAccessToken"]
    other = (await create(env)).json()
    url = "/e2b/sandbox/process.Process/List"
    rpc = {"Content-Type": "application/json", "E2b-Sandbox-Port": "49983", "Authorization": ""}
    before = env.calls("proc_list")
    for headers in (
        {},  # no token
        {"E2b-Sandbox-Id": sid, "X-Access-Token": "wrong"},
        {"E2b-Sandbox-Id": sid, "X-Access-Token": other["envdAccessToken"]},  # another sandbox's token
        {"E2b-Sandbox-Id": other["sandboxID"] + "x", "X-Access-Token": other["envdAccessToken"]},
    ):
        refused = await env.client.post(url, json={}, headers={**rpc, **headers})
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.json()["code"] == "unauthenticated"  # Connect's shape: the SDK raises AuthenticationException
    assert env.calls("proc_list") == before  # refused at the gate: the agent never heard of it
    listed = await env.client.post(url, json={}, headers={**rpc, "E2b-Sandbox-Id": sid, "X-Access-Token": token})
    assert listed.status_code == 200, listed.text
    assert listed.json() == {} and env.calls("proc_list") == before + 1  # an empty list is {} in proto JSON
    health = await env.client.get(
        "/e2b/sandbox/health", headers={**rpc, "E2b-Sandbox-Id": sid, "X-Access-Token": token}
    )
    assert health.status_code == 204


async def test_unserved_routes_are_404_in_e2b_shape(env: Env) -> None:
    sid = (await create(env)).json()["sandboxID"]
    volumes = await env.client.put(f"/e2b/sandboxes/{sid}/volumes", json={}, headers=e2b(env))
    assert volumes.status_code == 404 and volumes.json()["code"] == 404
    assert "PUT /sandboxes/" in volumes.json()["message"]


async def test_the_traffic_token_opens_guest_ports_but_never_envd(env: Env) -> None:
    made = (await create(env, network={"allowPublicTraffic": False})).json()
    sid, traffic = made["sandboxID"], made["trafficAccessToken"]
    assert traffic and traffic != made["envdAccessToken"]
    base = {"E2b-Sandbox-Id": sid, "E2B-Traffic-Access-Token": traffic, "Authorization": ""}
    envd = await env.client.post(
        "/e2b/sandbox/process.Process/List",
        json={},
        headers={**base, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"},
    )
    assert envd.status_code == 401  # a port's token does not run commands
    port = await env.client.get("/e2b/sandbox/anything", headers={**base, "E2b-Sandbox-Port": "8000"})
    # through the gate and the envd app to the proxy: the fake guest's port 8000 (127.0.0.1:9/8000) is closed
    assert port.status_code == 502 and port.json()["code"] == "port_unreachable", port.text
    assert ("port_target", (sid, 8000)) in env.agent.calls


async def test_create_fields_cryobox_does_not_enforce_are_refused_naming_them_and_create_nothing(env: Env) -> None:
    """E2B's ``network`` request rules, a filesystem-only pause, ``autoResume`` without ``autoPause``, MCP, IAM,
    volume mounts and ``secure: false`` would be silently dropped (unrestricted egress, a different resume); they
    are 400s naming the field, and no sandbox exists afterwards. Values that ask for nothing pass."""
    refused = {
        "network": {"allowOut": ["example.org"], "rules": {"example.org": [{}]}},
        "autoPauseMemory": False,
        "autoResume": {"enabled": True},
        "mcp": {"github": {"token": "x"}},
        "iam": {"aws": {"role": "r"}},
        "volumeMounts": [{"name": "data", "path": "/data", "readOnly": True}],
        "secure": False,
        "frobnicate": 1,
    }
    for field, value in refused.items():
        pause = {"autoPause": True} if field == "autoPauseMemory" else {}
        response = await create(env, **{field: value, "allow_internet_access": True, **pause})
        assert response.status_code == 400, (field, response.text)
        assert field in response.json()["message"], response.json()
    listed = await env.client.get("/e2b/v2/sandboxes", headers=e2b(env))
    assert listed.json() == []
    fine = await create(
        env, network={}, autoPause=False, autoPauseMemory=True, autoResume={"enabled": False}, mcp=None, secure=True
    )
    assert fine.status_code == 201, fine.text
    assert (await env.client.delete(f"/e2b/sandboxes/{fine.json()['sandboxID']}", headers=e2b(env))).status_code == 204


async def test_a_template_by_name_and_tag(env: Env) -> None:
    """``Sandbox.create("name:tag")``: the tag must be on the build the template serves (``base`` has one build, its
    ``default``); an unknown tag is a 404 and creates nothing (:mod:`cryobox.compat.e2b.tags`)."""
    made = await create(env, templateID="base:default")
    assert made.status_code == 201 and made.json()["templateID"] == "base", made.text
    interpreter = await create(env, templateID="code-interpreter-v1:default")  # the alias, resolved (not built here)
    assert interpreter.json()["message"] == "template 'code-interpreter' not found (not_found)", interpreter.text
    before = env.calls("create")
    missing = await create(env, templateID="base:stable")
    assert missing.status_code == 404 and "stable" in missing.json()["message"], missing.text
    assert env.calls("create") == before
