"""The port routes: the control plane's ``/v1/sandboxes/{id}/ports|proxy/{port}/…`` (API key, workspaces, port
checks, HTTP and WebSocket through to a real upstream) and a host agent's ``/agent/v1/sandboxes/{id}/ports/…``
(node token for HTTP and WebSocket alike, and the two hops chained). Real uvicorn servers on 127.0.0.1 in the
test's loop; the upstreams come from :mod:`tests.support.upstream`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from cryobox.agentapi import models as m
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.agentapi.http_ports import add_port_routes
from cryobox.agentapi.http_server import AgentGuard
from cryobox.compose.app import create_app
from cryobox.errors import InvalidArgument
from cryobox.netpolicy import EgressPolicy
from cryobox.proxy import PortProxy
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from cryobox.server.control.quotas import Quota
from tests.support import registry as registry_support
from tests.support.control import control_plane
from tests.support.fake_agent import FakeAgent
from tests.support.upstream import Upstream, free_port, pick_subprotocol, proxy_app, serving, ws_gate

registry = registry_support.sqlite_registry

HTTP_PORT, WS_PORT, CLOSED_PORT = 8000, 9000, 7000
NODE_TOKEN = "node-token-for-tests"


class PortAgent(FakeAgent):
    """A fake agent whose guest ports are real servers on 127.0.0.1."""

    def __init__(self, targets: dict[int, m.PortTarget], **kw: Any) -> None:
        super().__init__(**kw)
        self.targets = targets

    async def port_target(self, sandbox_id: str, port: int) -> m.PortTarget:
        self._record("port_target", sandbox_id, port)
        self._guest(sandbox_id)
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be 1-65535, got {port}")
        return self.targets[port]


@dataclass
class Upstreams:
    state: Upstream
    targets: dict[int, m.PortTarget] = field(default_factory=dict)


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    state = Upstream()
    ws_server = await serve(
        state.ws_handler, "127.0.0.1", 0, process_request=ws_gate, select_subprotocol=pick_subprotocol
    )
    ws_port = next(iter(ws_server.sockets)).getsockname()[1]
    try:
        async with serving(state.http, ws="none") as http_url:
            yield Upstreams(
                state,
                {
                    HTTP_PORT: m.PortTarget(url=f"{http_url}/base"),
                    WS_PORT: m.PortTarget(url=f"http://127.0.0.1:{ws_port}"),
                    CLOSED_PORT: m.PortTarget(url=f"http://127.0.0.1:{free_port()}"),
                },
            )
    finally:
        ws_server.close()
        await ws_server.wait_closed()


# --- the control plane ---------------------------------------------------------------------------------------


@dataclass
class Api:
    url: str
    client: httpx.AsyncClient
    other: httpx.AsyncClient
    """A key of another workspace."""
    key: str
    sandbox: str
    upstream: Upstream

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://")


@pytest.fixture
async def api(registry: Registry, upstreams: Upstreams) -> AsyncIterator[Api]:
    agent = PortAgent(upstreams.targets, name="a")
    control = control_plane(registry, {"a": agent}, quota=Quota())
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x")
    await control.fleet.heartbeat(await heartbeat_of(agent))
    _, key = registry.create_key(registry.ensure_workspace("alpha").id)
    _, other_key = registry.create_key(registry.ensure_workspace("beta").id)
    async with serving(app) as url:  # the app's lifespan closes the control plane and the proxy
        async with (
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=20) as client,
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {other_key}"}, timeout=20) as other,
        ):
            made = await client.post("/v1/sandboxes", json={"template": "base"})
            assert made.status_code == 201, made.text
            yield Api(url, client, other, key, made.json()["id"], upstreams.state)


def _seen(answer: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in answer.json()["headers"]}


async def test_http_reaches_the_guest_port_through_both_route_spellings(api: Api) -> None:
    for kind in ("ports", "proxy"):
        answer = await api.client.post(f"/v1/sandboxes/{api.sandbox}/{kind}/{HTTP_PORT}/echo/x%2Fy?q=1", content=b"hi")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["raw_path"] == "/base/echo/x%2Fy" and body["query"] == "q=1" and body["length"] == 2
        seen = _seen(answer)
        assert "authorization" not in seen and api.key not in json.dumps(body)
    bare = await api.client.get(f"/v1/sandboxes/{api.sandbox}/ports/{HTTP_PORT}")
    assert bare.status_code == 404 and bare.text == "no such upstream route"  # the guest's own answer for "/base/"
    metrics = (await api.client.get("/metrics")).text
    assert 'route="/v1/sandboxes/{sandbox_id}/proxy/{port}/{path:path}",status="200"' in metrics
    assert 'route="/v1/sandboxes/{sandbox_id}/ports/{port}",status="404"' in metrics


async def test_a_closed_guest_port_is_502_port_unreachable(api: Api) -> None:
    answer = await api.client.get(f"/v1/sandboxes/{api.sandbox}/ports/{CLOSED_PORT}/")
    assert answer.status_code == 502
    body = answer.json()
    assert body["code"] == "port_unreachable" and "port is not open" in body["error"]
    assert str(CLOSED_PORT) in body["error"]


async def test_the_policys_host_mask_is_the_host_the_guest_sees_and_the_key_is_still_needed(api: Api) -> None:
    plain = _seen(await api.client.get(f"/v1/sandboxes/{api.sandbox}/ports/{HTTP_PORT}/echo"))
    assert plain["host"].startswith("127.0.0.1:")
    masked = {"default": "deny", "mask_request_host": "${PORT}-app.example.org", "public_traffic": True}
    assert (await api.client.put(f"/v1/sandboxes/{api.sandbox}/network", json=masked)).status_code == 200
    seen = _seen(await api.client.get(f"/v1/sandboxes/{api.sandbox}/ports/{HTTP_PORT}/echo"))
    assert seen["host"] == f"{HTTP_PORT}-app.example.org" and seen["x-forwarded-host"] != seen["host"]
    async with httpx.AsyncClient(base_url=api.url) as anonymous:  # public traffic opens E2B's URL, not /v1
        assert (await anonymous.get(f"/v1/sandboxes/{api.sandbox}/ports/{HTTP_PORT}/echo")).status_code == 401


async def test_no_key_is_401_and_another_workspace_is_404(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url) as anonymous:
        missing = await anonymous.get(f"/v1/sandboxes/{api.sandbox}/ports/{HTTP_PORT}/echo")
    assert missing.status_code == 401 and missing.json()["code"] == "unauthorized"
    foreign = await api.other.get(f"/v1/sandboxes/{api.sandbox}/ports/{HTTP_PORT}/echo")
    assert foreign.status_code == 404 and foreign.json()["code"] == "not_found"
    unknown = await api.client.get(f"/v1/sandboxes/sb-nope/proxy/{HTTP_PORT}/echo")
    assert unknown.status_code == 404


@pytest.mark.parametrize("port", ["0", "70000", "-1", "http"])
async def test_a_port_outside_1_to_65535_is_400(api: Api, port: str) -> None:
    answer = await api.client.get(f"/v1/sandboxes/{api.sandbox}/ports/{port}/echo")
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_argument"


async def test_websocket_through_the_control_plane(api: Api) -> None:
    url = f"{api.ws}/v1/sandboxes/{api.sandbox}/ports/{WS_PORT}/chat"
    auth = {"Authorization": f"Bearer {api.key}"}
    async with connect(url, proxy=None, additional_headers=auth, subprotocols=[Subprotocol("chat.v1")]) as ws:
        assert ws.subprotocol == "chat.v1"
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send(b"\x01\x02")
        assert await ws.recv() == b"\x01\x02"
    assert "authorization" not in api.upstream.ws_requests[-1]


async def test_websocket_refusals_are_http_answers_to_the_handshake(api: Api) -> None:
    base = f"{api.ws}/v1/sandboxes/{api.sandbox}/ports"
    cases: list[tuple[str, dict[str, str], int, str]] = [
        (f"{base}/{WS_PORT}/x", {}, 401, "unauthorized"),
        (f"{base}/{WS_PORT}/x", {"Authorization": "Bearer nope"}, 401, "unauthorized"),
        (f"{base}/0/x", {"Authorization": f"Bearer {api.key}"}, 400, "invalid_argument"),
        (f"{base}/{CLOSED_PORT}/x", {"Authorization": f"Bearer {api.key}"}, 502, "port_unreachable"),
        (f"{api.ws}/v1/sandboxes/sb-nope/ports/{WS_PORT}/", {"Authorization": f"Bearer {api.key}"}, 404, "not_found"),
    ]
    for url, headers, status, code in cases:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, proxy=None, additional_headers=headers):
                pass
        assert refused.value.response.status_code == status, url
        assert json.loads(bytes(refused.value.response.body or b""))["code"] == code


# --- a host agent's port route, and the two hops chained -----------------------------------------------------


@dataclass
class AgentSide:
    url: str
    sandbox: str
    upstream: Upstream
    agent: PortAgent

    def target(self, port: int, token: str = NODE_TOKEN) -> m.PortTarget:
        """What ``HttpAgent.port_target`` names: the agent's own port route, with the node token."""
        return m.PortTarget(
            url=f"{self.url}/agent/v1/sandboxes/{self.sandbox}/ports/{port}",
            headers={"Authorization": f"Bearer {token}"},
        )


@pytest.fixture
async def agent_side(upstreams: Upstreams) -> AsyncIterator[AgentSide]:
    agent = PortAgent(upstreams.targets)
    info = await agent.create(m.CreateSpec(sandbox_id="sb-1", template="base", workspace_id="w"))
    app = FastAPI()
    add_port_routes(app, agent, PortProxy(), token=NODE_TOKEN)
    app.add_middleware(AgentGuard, token=NODE_TOKEN)
    async with serving(app) as url:
        yield AgentSide(url, info.id, upstreams.state, agent)


async def test_the_agent_route_needs_the_node_token_for_http_and_websocket(agent_side: AgentSide) -> None:
    route = f"{agent_side.url}/agent/v1/sandboxes/{agent_side.sandbox}/ports"
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{route}/{HTTP_PORT}/echo")).status_code == 401
        bad = await client.get(f"{route}/{HTTP_PORT}/echo", headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401
        good = await client.get(f"{route}/{HTTP_PORT}/echo", headers={"Authorization": f"Bearer {NODE_TOKEN}"})
        assert good.status_code == 200 and "authorization" not in _seen(good)
        zero = await client.get(f"{route}/0/echo", headers={"Authorization": f"Bearer {NODE_TOKEN}"})
        assert zero.status_code == 400
    ws_route = route.replace("http://", "ws://")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"{ws_route}/{WS_PORT}/x", proxy=None, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 403  # AgentGuard closes it before the route runs
    assert not agent_side.upstream.ws_requests  # nothing reached the guest


async def test_two_hops_control_plane_proxy_to_agent_to_guest(agent_side: AgentSide) -> None:
    """What a fleet does: the control plane's proxy sends to the agent's route with the node token; the agent
    proxies again to the guest. The guest sees neither key nor token, and the client's forwarding headers."""
    targets = {str(p): agent_side.target(p) for p in (HTTP_PORT, WS_PORT, CLOSED_PORT)}
    async with serving(proxy_app(PortProxy(), targets)) as front:
        async with httpx.AsyncClient(base_url=front, timeout=20) as client:
            answer = await client.post(
                f"/{HTTP_PORT}/echo/deep?z=9", content=b"x" * 100_000, headers={"Authorization": "Bearer api-key"}
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["raw_path"] == "/base/echo/deep" and body["query"] == "z=9" and body["length"] == 100_000
            seen = _seen(answer)
            assert "authorization" not in seen and "x-node-token" not in seen
            assert seen["x-forwarded-for"] == "127.0.0.1, 127.0.0.1"  # the client, then the control plane's hop
            assert seen["x-forwarded-host"] == front.removeprefix("http://")
            closed = await client.get(f"/{CLOSED_PORT}/")
            assert closed.status_code == 502 and closed.json()["code"] == "port_unreachable"
            assert "port is not open" in closed.json()["error"]
        ws_front = front.replace("http://", "ws://")
        async with connect(f"{ws_front}/{WS_PORT}/chat", proxy=None) as ws:
            await ws.send("two hops")
            assert await ws.recv() == "two hops"
            await ws.close(4003, "done")
        assert "authorization" not in agent_side.upstream.ws_requests[-1]
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"{ws_front}/{CLOSED_PORT}/x", proxy=None):
                pass
        assert refused.value.response.status_code == 502
        assert json.loads(bytes(refused.value.response.body or b""))["code"] == "port_unreachable"


async def test_the_agent_hop_sends_the_policys_host_mask_too(agent_side: AgentSide) -> None:
    """In a fleet the agent's route proxies again: it sends the masked Host as the control plane's hop does."""
    route = f"{agent_side.url}/agent/v1/sandboxes/{agent_side.sandbox}/ports/{HTTP_PORT}/echo"
    auth = {"Authorization": f"Bearer {NODE_TOKEN}"}
    async with httpx.AsyncClient() as client:
        plain = await client.get(route, headers=auth)
        assert _seen(plain)["host"].startswith("127.0.0.1:")
        policy = EgressPolicy(mask_request_host="${PORT}-app.example.org")
        await agent_side.agent.set_network(agent_side.sandbox, m.NetworkUpdate(policy=policy))
        masked = await client.get(route, headers=auth)
        assert _seen(masked)["host"] == f"{HTTP_PORT}-app.example.org"
