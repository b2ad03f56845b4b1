"""Network policy on real VMs: a guest's names resolve and its connections go out only as its policy says, the
policy changes live, and it travels with the sandbox (snapshot, restore, fork, hibernation). The guests resolve
in the suite's own internet (``suite_internet``: several names, two on one address) and reach its servers;
nothing leaves this machine."""

from __future__ import annotations

import time
from typing import Any

from tests.support.guestnet import reached
from tests.support.internet import Internet
from tests.support.serve import Client


def network(client: Client, sandbox_id: str) -> dict[str, Any]:
    policy: dict[str, Any] = client.call("GET", f"/v1/sandboxes/{sandbox_id}/network")
    return policy


def test_a_policy_by_name_holds_changes_live_and_travels_with_the_sandbox(
    client: Client, suite_internet: Internet
) -> None:
    first = {"default": "deny", "allow": ["example.org", "*.example.net"], "deny": ["cdn-b.example.net"]}
    sbx = client.create(network=first)
    assert sbx["network"]["allow"] == ["example.org", "*.example.net"]
    assert reached(client, sbx["id"]) == {"example.org", "cdn-a.example.net"}  # cdn-b shares cdn-a's address
    assert "cdn-b.example.net" not in suite_internet.queries  # a denied name is never asked upstream
    log = client.call("GET", f"/v1/sandboxes/{sbx['id']}/egress", params={"limit": 1000})
    denied = {(d["name"], d["reason"]) for d in log["items"] if not d["allowed"]}
    assert {("cdn-b.example.net", "dns"), ("other.example.com", "dns")} <= denied
    assert any(d["allowed"] and d["name"] == "example.org" and d["bytes_in"] > 0 for d in log["items"])

    started = time.monotonic()
    client.call("PUT", f"/v1/sandboxes/{sbx['id']}/network", json={"allow": ["other.example.com"]})
    put_ms = (time.monotonic() - started) * 1000
    assert put_ms < 1000  # the agent swaps a reference; the HTTP round trips are most of it
    assert network(client, sbx["id"])["allow"] == ["other.example.com"] and network(client, sbx["id"])["deny"] == []
    assert reached(client, sbx["id"]) == {"other.example.com"}
    print(f"policy update answered in {put_ms:.0f} ms")
    client.call("PUT", f"/v1/sandboxes/{sbx['id']}/network", 400, json={"allow": ["not a name!"]})
    assert network(client, sbx["id"])["allow"] == ["other.example.com"]  # a refused update changed nothing

    # a snapshot records the policy: a restore inherits it unless the create says otherwise
    snap = client.snapshot(sbx["id"])
    restored = client.create(from_snapshot=snap["id"])
    assert network(client, restored["id"])["allow"] == ["other.example.com"]
    assert reached(client, restored["id"]) == {"other.example.com"}
    opened = client.create(from_snapshot=snap["id"], network={"default": "allow"})
    assert network(client, opened["id"])["default"] == "allow"

    # a fork child runs under its parent's policy
    child = client.call("POST", f"/v1/sandboxes/{sbx['id']}/fork", 201, json={})["sandbox"]
    client.track(child)
    assert child["network"]["allow"] == ["other.example.com"]
    assert network(client, child["id"])["allow"] == ["other.example.com"]
    assert reached(client, child["id"]) == {"other.example.com"}

    # hibernation keeps it; a change made while hibernated holds when it wakes
    client.call("POST", f"/v1/sandboxes/{sbx['id']}/hibernate")
    assert reached(client, sbx["id"]) == {"other.example.com"}  # a request wakes it
    client.call("POST", f"/v1/sandboxes/{sbx['id']}/hibernate")
    client.call("PUT", f"/v1/sandboxes/{sbx['id']}/network", json={"allow": ["example.org"]})
    assert reached(client, sbx["id"]) == {"example.org"}
