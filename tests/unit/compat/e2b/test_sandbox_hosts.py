"""Sandbox hosts (``compat/e2b/sandbox_hosts.py``): which hosts are ``{port}-{sandbox_id}.{domain}``, the request
the middleware makes of one (plain ASGI calls), and through the whole app: envd behind the access token, guest ports
behind the traffic token or public, the client's ``E2b-*`` headers never steering, the domain in E2B's create and
detail and in ``/v1/info``, and other hosts left to the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from cryobox.compat.e2b.sandbox_hosts import SandboxHosts, normal_domain, parse_host
from cryobox.compose.app import create_app
from cryobox.errors import InvalidArgument
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.quotas import Quota
from tests.support.app import Env, agent, app_env, env, quota, registry
from tests.support.control import close_control, control_plane
from tests.support.fake_agent import FakeAgent

__all__ = ["agent", "env", "quota", "registry"]  # fixtures

DOMAIN = "cbx.test"
SID = "sb-0123456789ab"


@pytest.mark.parametrize(
    ("host", "found"),
    [
        (f"49983-{SID}.cbx.test", (49983, SID)),
        (f"8080-{SID}.CBX.Test", (8080, SID)),  # DNS names are case-insensitive
        ("8080-SB-0123456789AB.cbx.test:443", (8080, SID)),  # a port, and an upper-case id
        (f"1-{SID}.cbx.test.", (1, SID)),  # the fully qualified form
        (f"65535-{SID}.cbx.test", (65535, SID)),
        (f"65536-{SID}.cbx.test", None),
        (f"0-{SID}.cbx.test", None),
        (f"08080-{SID}.cbx.test", None),  # one name per port
        (f"8080-{SID}.other.test", None),
        (f"8080-{SID}.cbx.test.evil", None),
        (f"x.8080-{SID}.cbx.test", None),  # one label before the domain
        (f"8080-{SID}-.cbx.test", None),
        ("8080-sb_1.cbx.test", None),
        ("8080.cbx.test", None),
        ("api.cbx.test", None),
        ("cbx.test", None),
        ("[::1]:8080", None),
        ("", None),
    ],
)
def test_which_hosts_are_sandbox_hosts(host: str, found: tuple[int, str] | None) -> None:
    assert parse_host(host, DOMAIN) == found


def test_the_domain_is_a_dns_name() -> None:
    assert normal_domain(" Sandbox.Example.COM. ") == "sandbox.example.com"
    assert normal_domain("localhost") == "localhost"
    for bad in ("", "https://x.test", "x.test:443", "*.x.test", "x..test", "-x.test", "x" * 64 + ".test"):
        with pytest.raises(InvalidArgument):
            normal_domain(bad)


class Recorder:
    """An inner app that records the scope it got and answers 200."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})


async def _call(app: SandboxHosts, scope: Scope) -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(_: Message) -> None:
        return None

    await app(scope, receive, send)


def _scope(host: str | None, *, kind: str = "http", extra: list[tuple[bytes, bytes]] | None = None) -> Scope:
    headers = [(b"host", host.encode())] if host is not None else []
    return {
        "type": kind,
        "path": "/a b/c",
        "raw_path": b"/a%20b/c",
        "query_string": b"q=1",
        "root_path": "",
        "headers": headers + (extra or []),
    }


async def test_a_sandbox_host_becomes_a_sandbox_url_request_and_the_clients_headers_go() -> None:
    inner = Recorder()
    app = SandboxHosts(inner, "CBX.test")
    lying = [(b"e2b-sandbox-id", b"sb-other"), (b"e2b-sandbox-port", b"49983"), (b"x-access-token", b"t")]
    for kind in ("http", "websocket"):
        await _call(app, _scope(f"8080-{SID}.cbx.test", kind=kind, extra=lying))
        got = inner.scopes[-1]
        assert (
            got["type"] == kind and got["path"] == "/e2b/sandbox/a b/c" and got["raw_path"] == b"/e2b/sandbox/a%20b/c"
        )
        assert got["query_string"] == b"q=1"
        headers = got["headers"]
        assert [v for k, v in headers if k == b"e2b-sandbox-id"] == [SID.encode()]
        assert [v for k, v in headers if k == b"e2b-sandbox-port"] == [b"8080"]
        assert (b"x-access-token", b"t") in headers and (b"host", f"8080-{SID}.cbx.test".encode()) in headers


async def test_other_hosts_and_other_scopes_pass_unchanged() -> None:
    inner = Recorder()
    app = SandboxHosts(inner, DOMAIN)
    two = _scope(f"8080-{SID}.cbx.test", extra=[(b"host", b"api.cbx.test")])  # which one? neither
    for scope in (_scope("api.cbx.test"), _scope(None), two, {"type": "lifespan"}):
        await _call(app, scope)
        assert inner.scopes[-1] is scope


# -- through the app -------------------------------------------------------------------------------------------
@pytest.fixture
async def hosted(registry: Registry) -> AsyncIterator[Env]:
    """The app with the sandbox domain ``cbx.test``."""
    async with app_env(registry, FakeAgent(name="a"), Quota(), sandbox_domain="CBX.test.") as made:
        yield made


def e2b(env: Env) -> dict[str, str]:
    return {"X-API-Key": env.client.headers["Authorization"].split()[1], "Authorization": ""}


async def create(env: Env, **body: Any) -> dict[str, Any]:
    made = await env.client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body}, headers=e2b(env))
    assert made.status_code == 201, made.text
    result: dict[str, Any] = made.json()
    return result


def host(port: int, sandbox_id: str) -> dict[str, str]:
    return {"Host": f"{port}-{sandbox_id}.cbx.test", "Authorization": ""}


async def test_the_domain_is_what_create_connect_and_detail_return_and_info_says(hosted: Env, env: Env) -> None:
    made = await create(hosted)
    assert made["domain"] == DOMAIN
    sid = made["sandboxID"]
    detail = await hosted.client.get(f"/e2b/sandboxes/{sid}", headers=e2b(hosted))
    connected = await hosted.client.post(f"/e2b/sandboxes/{sid}/connect", json={}, headers=e2b(hosted))
    assert detail.json()["domain"] == DOMAIN and connected.json()["domain"] == DOMAIN
    assert (await hosted.client.get("/v1/info")).json()["sandbox_domain"] == DOMAIN
    # without one: null (the SDK then takes its own E2B_DOMAIN), and no host is a sandbox host
    assert (await create(env))["domain"] is None
    assert (await env.client.get("/v1/info")).json()["sandbox_domain"] is None
    plain = await create(env)
    headers = {**host(49983, plain["sandboxID"]), "X-Access-Token": plain["envdAccessToken"]}
    assert (await env.client.get("/healthz", headers=headers)).json() == {"status": "ok"}  # the API's own
    headers = {**host(49983, sid), "X-Access-Token": made["envdAccessToken"]}
    assert (await hosted.client.get("/healthz", headers=headers)).status_code == 404  # envd has none


async def test_envd_is_behind_the_access_token_only(hosted: Env) -> None:
    public = await create(hosted)
    private = await create(hosted, network={"allowPublicTraffic": False})
    sid = public["sandboxID"]
    envd = {**host(49983, sid), "X-Access-Token": public["envdAccessToken"]}
    health = await hosted.client.get("/health", headers=envd)
    assert health.status_code == 204, health.text
    mounted = await hosted.client.get("/e2b/sandbox/health", headers=envd)  # the path is the guest's, as sent
    assert mounted.status_code == 404, mounted.text
    for token in ("", "wrong", private["envdAccessToken"]):
        refused = await hosted.client.get("/health", headers={**host(49983, sid), "X-Access-Token": token})
        assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated", refused.text
    traffic = {**host(49983, private["sandboxID"]), "E2b-Traffic-Access-Token": private["trafficAccessToken"]}
    assert (await hosted.client.get("/health", headers=traffic)).status_code == 401  # not envd's token
    # the host decides: a guest port's host with envd's headers is still that port
    lying = {**host(8000, sid), "E2b-Sandbox-Port": "49983", "X-Access-Token": public["envdAccessToken"]}
    assert (await hosted.client.get("/health", headers=lying)).status_code == 502
    assert ("port_target", (sid, 8000)) in hosted.agent.calls


async def test_guest_ports_are_public_or_behind_the_traffic_token(hosted: Env) -> None:
    public = await create(hosted)
    private = await create(hosted, network={"allowPublicTraffic": False})
    pid, qid = public["sandboxID"], private["sandboxID"]
    # through to the proxy: the fake guest's port 8000 is closed
    served = await hosted.client.get("/x?y=1", headers={**host(8000, pid), "E2b-Sandbox-Id": qid})
    assert served.status_code == 502 and ("port_target", (pid, 8000)) in hosted.agent.calls
    for sandbox_id in (qid, "sb-nope"):
        refused = await hosted.client.get("/x", headers=host(8000, sandbox_id))
        assert refused.status_code == 401, refused.text
    assert ("port_target", (qid, 8000)) not in hosted.agent.calls
    token = {**host(8000, qid), "E2b-Traffic-Access-Token": private["trafficAccessToken"]}
    assert (await hosted.client.get("/x", headers=token)).status_code == 502
    assert ("port_target", (qid, 8000)) in hosted.agent.calls


async def test_other_hosts_are_the_api(hosted: Env) -> None:
    assert (await hosted.client.get("/healthz", headers={"Host": "api.cbx.test"})).status_code == 200
    listed = await hosted.client.get("/v1/sandboxes", headers={"Host": "8080-sb-x.elsewhere.test"})
    assert listed.status_code == 200, listed.text
    made = await hosted.client.post(
        "/e2b/v2/sandboxes", json={"templateID": "base"}, headers={**e2b(hosted), "Host": "api.cbx.test"}
    )
    assert made.status_code == 201
    # a sandbox host never reaches the API, key or not
    key = hosted.client.headers["Authorization"]
    on_sandbox = await hosted.client.get("/v1/sandboxes", headers={**host(49983, SID), "Authorization": key})
    assert on_sandbox.status_code == 401 and on_sandbox.json()["code"] == "unauthenticated"


async def test_a_bad_domain_stops_the_app_being_built(registry: Registry) -> None:
    control = control_plane(registry, {"a": FakeAgent(name="a")}, quota=Quota())
    limiter = RateLimiter.from_config(RateLimitConfig.from_env({}))
    try:
        with pytest.raises(InvalidArgument, match="not a DNS name"):
            create_app(control, limiter=limiter, host="x", sandbox_domain="https://cbx.test")
    finally:
        await close_control(control)
