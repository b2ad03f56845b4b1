"""SDK: a sandbox's network policy (create, read, replace live) and its egress decision log, over an
httpx.MockTransport, for the sync and the async classes alike (``api`` is parametrized ``sync`` / ``async``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import cryobox
from cryobox import AsyncSandbox, EgressDecision, EgressLog, NetworkPolicy, Sandbox, models
from cryobox.errors import CryoboxError, InvalidArgument, NotFound
from tests.support.sdk import INFO, MockApi, Recorder, error_response, resolve, route

POLICY: dict[str, Any] = {
    "default": "deny",
    "allow": ["10.1.0.0/16", "198.51.100.7/32", "example.org", "*.pythonhosted.org"],
    "deny": ["10.1.2.0/24", "evil.example.org"],
    "ports": [80, 443],
    "public_traffic": False,
    "mask_request_host": "localhost:${PORT}",
}
DEFAULTS: dict[str, Any] = {
    "default": "deny",
    "allow": [],
    "deny": [],
    "ports": [],
    "public_traffic": True,
    "mask_request_host": None,
}
LOG: dict[str, Any] = {
    "items": [
        {
            "time": 1714564800.25,
            "name": "pypi.org",
            "ip": "151.101.0.223",
            "port": 443,
            "allowed": True,
            "reason": "allow-name",
            "bytes_out": 517,
            "bytes_in": 4096,
            "error": None,
        },
        {
            "time": 1714564801.5,
            "name": None,
            "ip": "192.0.2.9",
            "port": 22,
            "allowed": False,
            "reason": "port",
            "bytes_out": 0,
            "bytes_in": 0,
            "error": None,
        },
    ],
    "dropped": 7,
}


@pytest.fixture(params=["sync", "async"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[MockApi]:
    harness = MockApi(request.param)
    yield harness
    await harness.close()


def _json(request: httpx.Request) -> Any:
    return json.loads(request.content)


def _view(policy: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={**INFO, "network": policy})


# --- create ----------------------------------------------------------------------------------------------------


async def test_create_sends_a_policy_mapping_whole_and_normalized(api: MockApi) -> None:
    given = {"allow": ["10.1.0.0/16", "198.51.100.7", "Example.ORG"], "ports": [443, 80, 443]}
    sbx, rec = await api.create(lambda r: httpx.Response(201, json=INFO), template="base", network=given)
    (request,) = rec.requests
    assert route(request) == ("POST", "/v1/sandboxes")
    assert _json(request)["network"] == {
        **DEFAULTS,
        "allow": ["10.1.0.0/16", "198.51.100.7/32", "example.org"],
        "ports": [80, 443],
    }
    assert sbx.network == NetworkPolicy.model_validate(INFO["network"])


async def test_create_sends_a_policy_object(api: MockApi) -> None:
    policy = NetworkPolicy(default="allow", deny=["169.254.0.0/16"])
    _, rec = await api.create(lambda r: httpx.Response(201, json=INFO), network=policy)
    assert _json(rec.requests[0])["network"] == {**DEFAULTS, "default": "allow", "deny": ["169.254.0.0/16"]}


async def test_create_still_sends_the_older_network_shape_as_given(api: MockApi) -> None:
    _, rec = await api.create(lambda r: httpx.Response(201, json=INFO), network={"egress": "allow"})
    assert _json(rec.requests[0])["network"] == {"egress": "allow", "allow": []}
    spec = models.NetworkSpec(egress="allow", allow=["10.0.0.0/8"])
    _, rec = await api.create(lambda r: httpx.Response(201, json=INFO), network=spec)
    assert _json(rec.requests[0])["network"] == {"egress": "allow", "allow": ["10.0.0.0/8"]}


@pytest.mark.parametrize(
    ("network", "message"),
    [
        ({"default": "sometimes"}, "network.default"),
        ({"allow": ["2001:db8::/32"]}, "network.allow"),
        ({"allow": "example.org"}, "network.allow"),
        ({"ports": [0]}, "network.ports"),
        ({"surprise": True}, "network.surprise"),
    ],
)
async def test_create_refuses_a_bad_policy_before_sending(api: MockApi, network: Any, message: str) -> None:
    rec = Recorder(lambda r: httpx.Response(201, json=INFO))
    with pytest.raises(InvalidArgument, match=message):
        if api.kind == "sync":
            Sandbox.create(network=network, http=api._sync_http(rec))
        else:
            await AsyncSandbox.create(network=network, http=api._async_http(rec))
    assert rec.requests == []


async def test_a_view_with_a_field_this_client_does_not_know_still_reads(api: MockApi) -> None:
    view = {**INFO, "network": {**POLICY, "added_later": {"x": 1}}}
    sbx, _ = await api.create(lambda r: httpx.Response(201, json=view))
    assert sbx.network == NetworkPolicy.model_validate(POLICY)


async def test_a_view_without_network_reads_as_none(api: MockApi) -> None:
    view = {k: v for k, v in INFO.items() if k != "network"}
    sbx, _ = await api.create(lambda r: httpx.Response(201, json=view))
    assert sbx.network is None


# --- read and replace ------------------------------------------------------------------------------------------


async def test_get_network_reads_the_policy_and_updates_info(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json=POLICY))
    policy = await resolve(sbx.get_network())
    assert policy == NetworkPolicy.model_validate(POLICY)
    assert policy.mask_request_host == "localhost:${PORT}"
    assert sbx.network == policy and sbx.info.network == policy
    (request,) = rec.requests
    assert route(request) == ("GET", "/v1/sandboxes/sbx_0123/network")


async def test_set_network_puts_the_whole_policy_from_keywords(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: _view({**DEFAULTS, "allow": ["pypi.org"], "ports": [443]}))
    policy = await resolve(sbx.set_network(allow=["PyPI.org"], ports=[443]))
    (request,) = rec.requests
    assert route(request) == ("PUT", "/v1/sandboxes/sbx_0123/network")
    # replace, not patch: every field is sent, those not given at their defaults (INFO's old rules are gone)
    assert _json(request) == {**DEFAULTS, "allow": ["pypi.org"], "ports": [443]}
    assert policy == NetworkPolicy(allow=["pypi.org"], ports=[443])
    assert sbx.network == policy


async def test_set_network_keywords_override_the_given_policy(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: _view(POLICY))
    await resolve(sbx.set_network(POLICY, default="allow", deny=[], public_traffic=True))
    assert _json(rec.requests[0]) == {**POLICY, "default": "allow", "deny": [], "public_traffic": True}


async def test_set_network_with_nothing_denies_everything(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: _view(DEFAULTS))
    assert await resolve(sbx.set_network()) == NetworkPolicy()
    assert _json(rec.requests[0]) == DEFAULTS


async def test_set_network_takes_the_answer_as_the_sandbox_view(api: MockApi) -> None:
    sbx, _ = api.sandbox(lambda r: httpx.Response(200, json={**INFO, "status": "paused", "network": POLICY}))
    await resolve(sbx.set_network(POLICY))
    assert sbx.info.status == "paused"
    assert sbx.info.network == NetworkPolicy.model_validate(POLICY)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"default": "maybe"}, "network.default"),
        ({"allow": "example.org"}, "network.allow: must be a list"),
        ({"deny": ["bad name!"]}, "network.deny"),
        ({"ports": [70000]}, "network.ports"),
        ({"mask_request_host": "a/b"}, "network.mask_request_host"),
        ({"policy": ["not", "a", "mapping"]}, "network: expected a policy"),
    ],
)
async def test_set_network_refuses_a_bad_policy_before_sending(
    api: MockApi, kwargs: dict[str, Any], message: str
) -> None:
    sbx, rec = api.sandbox(lambda r: _view(DEFAULTS))
    with pytest.raises(InvalidArgument, match=message):
        await resolve(sbx.set_network(**kwargs))
    assert rec.requests == []


async def test_set_network_server_refusal_is_invalid_argument(api: MockApi) -> None:
    sbx, _ = api.sandbox(lambda r: error_response(400, "invalid_argument", "network.allow.0: not routable"))
    with pytest.raises(InvalidArgument, match="not routable"):
        await resolve(sbx.set_network(allow=["example.org"]))
    assert sbx.network == NetworkPolicy.model_validate(INFO["network"])  # unchanged


# --- egress log ------------------------------------------------------------------------------------------------


async def test_egress_log_is_typed(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json=LOG))
    log = await resolve(sbx.egress_log(limit=2))
    assert isinstance(log, EgressLog)
    assert log.dropped == 7
    assert log.items[0] == EgressDecision(
        time=1714564800.25,
        name="pypi.org",
        ip="151.101.0.223",
        port=443,
        allowed=True,
        reason="allow-name",
        bytes_out=517,
        bytes_in=4096,
    )
    assert (log.items[1].allowed, log.items[1].reason, log.items[1].name) == (False, "port", None)
    (request,) = rec.requests
    assert route(request) == ("GET", "/v1/sandboxes/sbx_0123/egress")
    assert dict(request.url.params) == {"limit": "2"}


async def test_egress_log_default_limit(api: MockApi) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json={"items": [], "dropped": 0}))
    assert await resolve(sbx.egress_log()) == EgressLog(items=[], dropped=0)
    assert rec.requests[0].url.query == b"limit=100"


@pytest.mark.parametrize("limit", [-1, 1001, True])
async def test_egress_log_limit_out_of_range_is_refused_before_sending(api: MockApi, limit: int) -> None:
    sbx, rec = api.sandbox(lambda r: httpx.Response(200, json=LOG))
    with pytest.raises(InvalidArgument, match="limit must be 0-1000"):
        await resolve(sbx.egress_log(limit=limit))
    assert rec.requests == []


async def test_egress_log_errors(api: MockApi) -> None:
    sbx, _ = api.sandbox(lambda r: error_response(404, "not_found", "no such sandbox"))
    with pytest.raises(NotFound):
        await resolve(sbx.egress_log())
    sbx, _ = api.sandbox(lambda r: httpx.Response(200, json={"items": [{"time": 1.0}]}))
    with pytest.raises(CryoboxError, match="unexpected response to GET /v1/sandboxes/sbx_0123/egress"):
        await resolve(sbx.egress_log())


def test_the_policy_model_is_netpolicys() -> None:
    assert cryobox.NetworkPolicy is cryobox.netpolicy.EgressPolicy
    assert models.EgressLog is EgressLog and models.EgressDecision is EgressDecision
