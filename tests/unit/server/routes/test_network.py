"""``/v1`` network policies over a control plane with a fake agent: create's ``network`` (the policy shape and the
legacy one), the ``Sandbox`` view's ``network``, ``PUT``/``GET …/network``, ``GET …/egress``, and a policy kept
by snapshots (a create from one that names no network inherits it), forks, and a hibernation (a change while
hibernated applies at the wake)."""

from __future__ import annotations

from typing import Any

from cryobox.agentapi import models as am
from cryobox.netpolicy import EgressPolicy
from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures

POLICY = {
    "default": "deny",
    "allow": ["203.0.113.0/24", "*.example.org"],
    "deny": ["bad.example.org"],
    "ports": [443],
    "public_traffic": False,
    "mask_request_host": "${PORT}-app.example.org",
}
CLOSED = EgressPolicy().model_dump(mode="json")


def _policy(value: dict[str, Any]) -> EgressPolicy:
    return EgressPolicy.model_validate(value)


async def test_create_takes_the_policy_and_the_view_reports_it(env: Env) -> None:
    made = await env.create(network=POLICY)
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    assert made.json()["network"] == _policy(POLICY).model_dump(mode="json")
    assert env.agent.sandboxes[sid].egress == _policy(POLICY)
    assert env.registry.get_sandbox(sid).egress == _policy(POLICY)
    plain = await env.create()
    assert plain.json()["network"] == CLOSED and env.agent.sandboxes[plain.json()["id"]].egress is None


async def test_the_legacy_shape_is_translated(env: Env) -> None:
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"egress": "allow"}, {"default": "deny", "allow": ["0.0.0.0/0"]}),
        ({"egress": "allow", "allow": ["198.51.100.0/24"]}, {"default": "deny", "allow": ["198.51.100.0/24"]}),
        ({"egress": "deny"}, {"default": "deny"}),
    ]
    for given, expected in cases:
        made = await env.create(network=given)
        assert made.status_code == 201, made.text
        assert env.agent.sandboxes[made.json()["id"]].egress == _policy(expected), given


async def test_bad_networks_are_400s_naming_the_field_and_create_nothing(env: Env) -> None:
    before = env.calls("create")
    for network, named in (
        ({"egress": "allow", "default": "allow"}, "network"),  # both shapes at once
        ({"allow": ["10.0.0.1/24"]}, "network.allow"),
        ({"default": "maybe"}, "network.default"),
        ({"ports": [70000]}, "network.ports"),
        ({"frobnicate": 1}, "network.frobnicate"),
        ({"egress": "allow", "allow": ["10.0.0.1/24"]}, "network"),
    ):
        refused = await env.create(network=network)
        assert refused.status_code == 400, (network, refused.text)
        assert named in refused.json()["error"], refused.json()
    assert env.calls("create") == before and env.rows() == 0


async def test_put_replaces_the_whole_policy_and_get_reads_it(env: Env) -> None:
    sid = await env.made(network=POLICY)
    changed = await env.client.put(f"/v1/sandboxes/{sid}/network", json={"default": "allow", "deny": ["10.0.0.0/8"]})
    assert changed.status_code == 200, changed.text
    expected = _policy({"default": "allow", "deny": ["10.0.0.0/8"]})  # public_traffic, mask, ports: defaults again
    assert changed.json()["network"] == expected.model_dump(mode="json")
    assert env.agent.sandboxes[sid].egress == expected and env.registry.get_sandbox(sid).egress == expected
    assert [a[0] for m, a in env.agent.calls if m == "set_network"] == [sid]
    read = await env.client.get(f"/v1/sandboxes/{sid}/network")
    assert read.status_code == 200 and read.json() == expected.model_dump(mode="json")
    cleared = await env.client.put(f"/v1/sandboxes/{sid}/network", json={})
    assert cleared.json()["network"] == CLOSED and env.registry.get_sandbox(sid).egress == EgressPolicy()


async def test_put_refuses_a_bad_policy_and_unknown_sandboxes(env: Env) -> None:
    sid = await env.made(network=POLICY)
    bad = await env.client.put(f"/v1/sandboxes/{sid}/network", json={"allow": ["2001:db8::/32"]})
    assert bad.status_code == 400 and "allow" in bad.json()["error"]
    unknown = await env.client.put(f"/v1/sandboxes/{sid}/network", json={"egress": "allow"})
    assert unknown.status_code == 400 and "egress" in unknown.json()["error"]
    assert env.calls("set_network") == 0 and env.registry.get_sandbox(sid).egress == _policy(POLICY)
    for method in ("put", "get"):
        missing = await env.client.request(method, "/v1/sandboxes/sb-nope/network", json={})
        assert missing.status_code == 404, missing.text
    other_ws = env.registry.ensure_workspace("beta").id
    _, key = env.registry.create_key(other_ws)
    theirs = await env.client.put(
        f"/v1/sandboxes/{sid}/network", json={"default": "allow"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert theirs.status_code == 404 and env.registry.get_sandbox(sid).egress == _policy(POLICY)


async def test_a_change_while_hibernated_is_kept_in_the_row_and_applied_at_the_wake(env: Env) -> None:
    sid = await env.made(network=POLICY)
    assert (await env.client.post(f"/v1/sandboxes/{sid}/hibernate")).status_code == 200
    opened = {"default": "allow"}
    changed = await env.client.put(f"/v1/sandboxes/{sid}/network", json=opened)
    assert changed.status_code == 200, changed.text  # the fake agent refuses a hibernated sandbox's change
    assert env.agent.sandboxes[sid].state == "hibernated" and env.agent.sandboxes[sid].egress == _policy(POLICY)
    assert env.registry.get_sandbox(sid).egress == _policy(opened)
    woke = await env.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo hi"})
    assert woke.status_code == 200, woke.text
    assert env.agent.sandboxes[sid].egress == _policy(opened)  # the wake applied the row's policy
    assert (await env.client.get(f"/v1/sandboxes/{sid}")).json()["network"] == _policy(opened).model_dump(mode="json")


async def test_hibernate_and_wake_keep_the_policy(env: Env) -> None:
    sid = await env.made(network=POLICY)
    assert (await env.client.post(f"/v1/sandboxes/{sid}/hibernate")).status_code == 200
    assert (await env.client.post(f"/v1/sandboxes/{sid}/wake")).status_code == 200
    assert env.agent.sandboxes[sid].egress == _policy(POLICY) and env.calls("set_network") == 0
    assert env.registry.get_sandbox(sid).egress == _policy(POLICY)


async def test_a_create_from_a_snapshot_inherits_its_policy_unless_it_names_one(env: Env) -> None:
    sid = await env.made(network=POLICY)
    snap = await env.client.post(f"/v1/sandboxes/{sid}/snapshots", json={})
    assert snap.status_code == 201, snap.text
    snap_id = snap.json()["id"]
    assert env.registry.get_snapshot(snap_id).egress == _policy(POLICY)
    await env.client.put(f"/v1/sandboxes/{sid}/network", json={})  # later changes are not the snapshot's
    inherited = await env.made(from_snapshot=snap_id)
    assert env.agent.sandboxes[inherited].egress == _policy(POLICY)
    explicit = await env.made(from_snapshot=snap_id, network={"default": "allow"})
    assert env.agent.sandboxes[explicit].egress == _policy({"default": "allow"})
    legacy = await env.made(from_snapshot=snap_id, network={"egress": "deny"})
    assert env.agent.sandboxes[legacy].egress == EgressPolicy()


async def test_forks_keep_the_parents_policy(env: Env) -> None:
    sid = await env.made(network={"default": "deny"})
    await env.client.put(f"/v1/sandboxes/{sid}/network", json=POLICY)
    child = await env.client.post(f"/v1/sandboxes/{sid}/fork", json={})
    assert child.status_code == 201, child.text
    assert child.json()["sandbox"]["network"] == _policy(POLICY).model_dump(mode="json")
    tree = await env.client.post(f"/v1/sandboxes/{sid}/fork-tree", json={"count": 2})
    assert tree.status_code == 201, tree.text
    for made in tree.json()["children"]:
        assert env.registry.get_sandbox(made["id"]).egress == _policy(POLICY)
    assert env.registry.get_snapshot(tree.json()["snapshot_id"]).egress == _policy(POLICY)


async def test_the_egress_log(env: Env) -> None:
    sid = await env.made()
    decisions = [
        am.EgressDecision(
            time=float(n), name="example.org", ip="93.184.216.34", port=443, allowed=n % 2 == 0, reason="x"
        )
        for n in range(3)
    ]
    env.agent.egress_decisions[sid] = decisions
    log = await env.client.get(f"/v1/sandboxes/{sid}/egress", params={"limit": 2})
    assert log.status_code == 200, log.text
    assert [d["time"] for d in log.json()["items"]] == [1.0, 2.0] and log.json()["dropped"] == 1
    assert len((await env.client.get(f"/v1/sandboxes/{sid}/egress")).json()["items"]) == 3
    for limit in (-1, 1001):
        assert (await env.client.get(f"/v1/sandboxes/{sid}/egress", params={"limit": limit})).status_code == 400
    assert (await env.client.get("/v1/sandboxes/sb-nope/egress")).status_code == 404


async def test_the_openapi_document_has_the_network_routes(env: Env) -> None:
    paths = (await env.client.get("/openapi.json")).json()["paths"]
    assert {"put", "get"} <= set(paths["/v1/sandboxes/{sandbox_id}/network"])
    assert "get" in paths["/v1/sandboxes/{sandbox_id}/egress"]
