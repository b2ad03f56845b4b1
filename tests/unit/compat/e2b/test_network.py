"""E2B's network options (``compat/e2b/network.py``): the mapping onto cryobox's policy, the refusals naming each
field cryobox does not enforce, the operator's default (``CRYOBOX_E2B_INTERNET``), ``update_network``, the
detail's ``allowInternetAccess``/``network``, and ports public or behind the traffic token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from cryobox.compat.e2b.network import E2BSettings, network_info, to_policy
from cryobox.errors import InvalidArgument
from cryobox.netpolicy import EgressPolicy
from cryobox.registry import Registry
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, agent, app_env, env, quota, registry
from tests.support.fake_agent import FakeAgent

__all__ = ["agent", "env", "quota", "registry"]  # fixtures

ON, OFF = E2BSettings(internet=True), E2BSettings(internet=False)
ALL = "0.0.0.0/0"


def e2b(env: Env) -> dict[str, str]:
    return {"X-API-Key": env.client.headers["Authorization"].split()[1], "Authorization": ""}


async def create(env: Env, **body: object) -> httpx.Response:
    return await env.client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body}, headers=e2b(env))


@pytest.mark.parametrize(
    ("internet", "network", "default", "allow", "deny"),
    [
        (None, None, None, None, None),  # nothing said: the caller decides
        (True, None, "allow", [], []),
        (False, None, "deny", [], []),
        (None, {}, "allow", [], []),  # the operator's default (on)
        (None, {"allowOut": ["1.1.1.1"], "denyOut": [ALL]}, "deny", ["1.1.1.1/32"], []),
        (True, {"allowOut": ["example.org"], "denyOut": [ALL]}, "deny", ["example.org"], []),
        (False, {"allowOut": ["8.8.8.0/24"]}, "deny", ["8.8.8.0/24"], []),
        (None, {"denyOut": ["10.0.0.0/8", "bad.example"]}, "allow", [], ["10.0.0.0/8", "bad.example"]),
        (True, {"allowOut": ["1.2.3.4"], "denyOut": ["1.2.3.0/24"]}, "allow", ["1.2.3.4/32"], ["1.2.3.0/24"]),
    ],
)
def test_the_mapping_table(
    internet: bool | None, network: dict[str, Any] | None, default: str | None, allow: Any, deny: Any
) -> None:
    policy = to_policy(internet, network, ON)
    if default is None:
        assert policy is None
        return
    assert policy is not None and (policy.default, policy.allow, policy.deny) == (default, allow, deny)


def test_the_operator_default_decides_what_is_unsaid() -> None:
    assert to_policy(None, {"allowOut": ["1.1.1.1"]}, OFF) == EgressPolicy(default="deny", allow=["1.1.1.1"])
    assert to_policy(True, {}, OFF) == EgressPolicy(default="allow")
    assert E2BSettings.from_env({}) == ON and E2BSettings.from_env({"CRYOBOX_E2B_INTERNET": "deny"}) == OFF
    with pytest.raises(InvalidArgument, match="CRYOBOX_E2B_INTERNET"):
        E2BSettings.from_env({"CRYOBOX_E2B_INTERNET": "maybe"})


def test_bad_rules_name_the_e2b_field() -> None:
    with pytest.raises(InvalidArgument, match=r"network\.allowOut"):
        to_policy(None, {"allowOut": ["10.0.0.1/24"]}, ON)
    with pytest.raises(InvalidArgument, match=r"network\.denyOut"):
        to_policy(None, {"denyOut": "0.0.0.0/0"}, ON)
    with pytest.raises(InvalidArgument, match=r"network\.maskRequestHost"):
        to_policy(None, {"maskRequestHost": "a b"}, ON)


def test_the_detail_shape() -> None:
    closed = EgressPolicy(allow=["1.1.1.1"], public_traffic=False, mask_request_host="${PORT}-x.example")
    assert network_info(closed) == (
        False,
        {
            "allowOut": ["1.1.1.1/32"],
            "denyOut": [ALL],
            "allowPublicTraffic": False,
            "maskRequestHost": "${PORT}-x.example",
        },
    )
    assert network_info(EgressPolicy(default="allow", deny=["10.0.0.0/8"])) == (
        True,
        {"allowOut": [], "denyOut": ["10.0.0.0/8"], "allowPublicTraffic": True},
    )
    assert network_info(None)[0] is False


async def test_create_maps_the_network_and_the_detail_reports_it(env: Env) -> None:
    made = await create(env, network={"allowOut": ["1.1.1.1"], "denyOut": [ALL], "maskRequestHost": "${PORT}-a.org"})
    assert made.status_code == 201, made.text
    sid = made.json()["sandboxID"]
    expected = EgressPolicy(allow=["1.1.1.1"], mask_request_host="${PORT}-a.org")
    assert env.agent.sandboxes[sid].egress == expected
    detail = (await env.client.get(f"/e2b/sandboxes/{sid}", headers=e2b(env))).json()
    assert detail["allowInternetAccess"] is False
    assert detail["network"]["allowOut"] == ["1.1.1.1/32"] and detail["network"]["denyOut"] == [ALL]
    plain = (await create(env)).json()["sandboxID"]
    assert env.agent.sandboxes[plain].egress == EgressPolicy(default="allow")  # E2B's default: internet on
    off = (await create(env, allow_internet_access=False)).json()["sandboxID"]
    assert env.agent.sandboxes[off].egress == EgressPolicy()


@pytest.mark.parametrize(
    ("network", "field"),
    [
        ({"rules": {"api.example.org": [{"transform": {"headers": {"X": "1"}}}]}}, "network.rules"),
        ({"egressProxy": {"address": "proxy.example.org:1080"}}, "network.egressProxy"),
        ({"dnsServers": ["1.1.1.1"]}, "network.dnsServers"),
        ({"httpsPorts": [3000]}, "network.httpsPorts"),
        ({"allow_out": ["1.1.1.1"]}, "network.allow_out"),
        ({"allowOut": ["1.1.1.1"], "frobnicate": True}, "network.frobnicate"),
    ],
)
async def test_unenforced_network_fields_are_refused_naming_them(env: Env, network: dict[str, Any], field: str) -> None:
    refused = await create(env, network=network)
    assert refused.status_code == 400 and field in refused.json()["message"], refused.text
    assert env.calls("create") == 0
    sid = (await create(env)).json()["sandboxID"]
    update = await env.client.put(f"/e2b/sandboxes/{sid}/network", json=network, headers=e2b(env))
    assert update.status_code == 400 and field in update.json()["message"], update.text
    assert env.calls("set_network") == 0


async def test_update_network_replaces_the_egress_rules_and_keeps_the_ingress_settings(env: Env) -> None:
    sid = (await create(env, network={"allowPublicTraffic": False, "maskRequestHost": "${PORT}-m.org"})).json()
    sid = sid["sandboxID"]
    body = {"allowOut": ["example.org"], "denyOut": [ALL]}
    updated = await env.client.put(f"/e2b/sandboxes/{sid}/network", json=body, headers=e2b(env))
    assert updated.status_code == 204, updated.text
    expected = EgressPolicy(allow=["example.org"], public_traffic=False, mask_request_host="${PORT}-m.org")
    assert env.agent.sandboxes[sid].egress == expected and env.registry.get_sandbox(sid).egress == expected
    opened = await env.client.put(
        f"/e2b/sandboxes/{sid}/network", json={"allow_internet_access": True}, headers=e2b(env)
    )
    assert opened.status_code == 204 and env.agent.sandboxes[sid].egress.default == "allow"  # type: ignore[union-attr]
    missing = await env.client.put("/e2b/sandboxes/sb-nope/network", json=body, headers=e2b(env))
    assert missing.status_code == 404 and missing.json()["code"] == 404  # the SDK: SandboxNotFoundException
    bad = await env.client.put(f"/e2b/sandboxes/{sid}/network", json={"allow_internet_access": "yes"}, headers=e2b(env))
    assert bad.status_code == 400 and "allow_internet_access" in bad.json()["message"]


async def test_public_ports_need_no_token_private_ones_the_traffic_token(env: Env) -> None:
    public = (await create(env)).json()
    private = (await create(env, network={"allowPublicTraffic": False})).json()
    assert public["trafficAccessToken"] is None and private["trafficAccessToken"]
    port = {"E2b-Sandbox-Port": "8000", "Authorization": ""}
    served = await env.client.get("/e2b/sandbox/x", headers={**port, "E2b-Sandbox-Id": public["sandboxID"]})
    # through to the proxy: the fake guest's port 8000 is closed
    assert served.status_code == 502 and ("port_target", (public["sandboxID"], 8000)) in env.agent.calls
    for sandbox_id in (private["sandboxID"], "sb-nope"):
        refused = await env.client.get("/e2b/sandbox/x", headers={**port, "E2b-Sandbox-Id": sandbox_id})
        assert refused.status_code == 401, refused.text
    assert ("port_target", (private["sandboxID"], 8000)) not in env.agent.calls
    token = {"E2B-Traffic-Access-Token": private["trafficAccessToken"], "E2b-Sandbox-Id": private["sandboxID"]}
    assert (await env.client.get("/e2b/sandbox/x", headers={**port, **token})).status_code == 502
    envd = {"E2b-Sandbox-Port": "49983", "Authorization": "", "E2b-Sandbox-Id": public["sandboxID"]}
    assert (await env.client.get("/e2b/sandbox/health", headers=envd)).status_code == 401  # envd never public
    # closing a public sandbox's ports takes effect at once
    await env.client.put(f"/v1/sandboxes/{public['sandboxID']}/network", json={"public_traffic": False})
    after = await env.client.get("/e2b/sandbox/x", headers={**port, "E2b-Sandbox-Id": public["sandboxID"]})
    assert after.status_code == 401


@pytest.fixture
async def closed_env(registry: Registry) -> AsyncIterator[Env]:
    """An app built with ``CRYOBOX_E2B_INTERNET=deny``."""
    async with app_env(registry, FakeAgent(name="a"), Quota(), e2b=OFF) as made:
        yield made


async def test_the_operator_can_make_unsaid_internet_off(closed_env: Env) -> None:
    plain = (await create(closed_env)).json()["sandboxID"]
    assert closed_env.agent.sandboxes[plain].egress == EgressPolicy()
    asked = (await create(closed_env, allow_internet_access=True)).json()["sandboxID"]
    assert closed_env.agent.sandboxes[asked].egress == EgressPolicy(default="allow")


async def test_a_create_from_a_snapshot_that_says_nothing_inherits_its_policy(env: Env) -> None:
    sid = (await create(env, allow_internet_access=False)).json()["sandboxID"]
    snap = await env.client.post(f"/e2b/sandboxes/{sid}/snapshots", json={"name": "s"}, headers=e2b(env))
    restored = (await create(env, templateID="s")).json()["sandboxID"]
    assert snap.status_code == 201 and env.agent.sandboxes[restored].egress == EgressPolicy()
    opened = (await create(env, templateID="s", allow_internet_access=True)).json()["sandboxID"]
    assert env.agent.sandboxes[opened].egress == EgressPolicy(default="allow")
