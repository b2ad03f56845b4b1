"""The port proxy (:mod:`cryobox.proxy`) between real servers on 127.0.0.1: a raw ASGI upstream on uvicorn that
echoes what it got, a ``websockets`` echo server, and uvicorn serving a bare app that calls
:meth:`PortProxy.forward` (``/<target>/<path>``: the first segment picks the target). Everything runs in the
test's event loop."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import pytest
from starlette.types import Scope
from websockets.asyncio.client import connect
from websockets.asyncio.server import Server, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from cryobox.errors import InvalidArgument
from cryobox.proxy import PortProxy, route_suffix
from cryobox.proxy.headers import request_headers, response_headers
from cryobox.proxy.target import PortTarget
from cryobox.proxy.urls import upstream_url
from tests.support.upstream import BLOB, Upstream, free_port, pick_subprotocol, proxy_app, serving, ws_gate

NODE_HEADER = {"X-Node-Token": "node-secret"}


# --- servers -------------------------------------------------------------------------------------------------


@dataclass
class Env:
    upstream: Upstream
    url: str
    """The proxy; ``/http/…`` goes to the HTTP upstream under ``/base``, ``/ws/…`` to the websocket server,
    ``/closed/…`` to a port nothing listens on."""
    plain_url: str
    """The same proxy on a server path without ``websocket.http.response``."""

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    upstream = Upstream()
    ws_server: Server = await serve(
        upstream.ws_handler,
        "127.0.0.1",
        0,
        process_request=ws_gate,
        select_subprotocol=pick_subprotocol,
        max_size=16 << 20,
        compression=None,
    )
    ws_port = next(iter(ws_server.sockets)).getsockname()[1]
    try:
        async with serving(upstream.http, ws="none") as http_url:
            targets = {
                "http": PortTarget(url=f"{http_url}/base", headers=NODE_HEADER),
                "ws": PortTarget(url=f"http://127.0.0.1:{ws_port}", headers=NODE_HEADER),
                "closed": PortTarget(url=f"http://127.0.0.1:{free_port()}"),
            }
            async with (
                serving(proxy_app(PortProxy(), targets)) as url,
                serving(proxy_app(PortProxy(), targets, deny=False)) as plain_url,
            ):
                yield Env(upstream, url, plain_url)
    finally:
        ws_server.close()
        await ws_server.wait_closed()


@pytest.fixture
async def client(env: Env) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=env.url, trust_env=False, timeout=20) as http:
        yield http


def _seen(answer: httpx.Response) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for name, value in answer.json()["headers"]:
        seen.setdefault(name, []).append(value)
    return seen


# --- HTTP ----------------------------------------------------------------------------------------------------


async def test_get_reaches_the_target_path_with_its_query_and_encoding(client: httpx.AsyncClient) -> None:
    answer = await client.get("/http/echo/a%2Fb/c?x=1&y=%20z")
    assert answer.status_code == 200
    body = answer.json()
    assert body["method"] == "GET" and body["raw_path"] == "/base/echo/a%2Fb/c" and body["query"] == "x=1&y=%20z"
    assert body["length"] == 0


async def test_post_bodies_are_byte_exact_both_ways(client: httpx.AsyncClient) -> None:
    payload = hashlib.sha256(b"seed").digest() * 8192  # 256 KiB, every byte value
    answer = await client.post("/http/mirror?status=201", content=payload)
    assert answer.status_code == 201 and answer.content == payload
    assert answer.headers["content-length"] == str(len(payload))
    blob = await client.get("/http/blob")
    assert blob.status_code == 200 and blob.content == BLOB


async def test_status_and_response_headers_pass_but_hop_by_hop_ones_do_not(client: httpx.AsyncClient) -> None:
    answer = await client.put("/http/mirror?status=418", content=b"teapot")
    assert answer.status_code == 418 and answer.content == b"teapot"
    assert answer.headers["x-upstream"] == "yes" and answer.headers["set-cookie"] == "jar=leak; Path=/"
    assert "x-resp-hop" not in answer.headers and "keep-alive" not in answer.headers
    assert len(answer.headers.get_list("date")) == 1 and len(answer.headers.get_list("server")) == 1


async def test_credentials_and_hop_by_hop_headers_never_reach_the_upstream(client: httpx.AsyncClient) -> None:
    sent = {
        "Authorization": "Bearer api-key",
        "X-API-Key": "api-key",
        "X-Access-Token": "envd-token",
        "E2b-Traffic-Access-Token": "traffic-token",
        "Proxy-Authorization": "Basic eDp5",
        "X-Custom-Secret": "stripped by name",
        "Cookie": "a=1; session=secret; b=2",
        "Connection": "keep-alive, X-Hop-Req",
        "X-Hop-Req": "named by Connection",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "X-Forwarded-For": "6.6.6.6",
        "X-Forwarded-Host": "spoofed.example",
        "Forwarded": "for=6.6.6.6",
        "X-Keep": "yes",
        "User-Agent": "agent/1",
    }
    seen = _seen(await client.get("/http/echo", headers=sent))
    for name in (
        "authorization",
        "x-api-key",
        "x-access-token",
        "e2b-traffic-access-token",
        "proxy-authorization",
        "x-custom-secret",
        "x-hop-req",
        "keep-alive",
        "te",
        "forwarded",
    ):
        assert name not in seen, name
    assert seen["cookie"] == ["a=1; b=2"]
    assert seen["x-keep"] == ["yes"] and seen["user-agent"] == ["agent/1"]
    assert seen["x-node-token"] == ["node-secret"]  # the target's headers
    assert seen["x-forwarded-for"] == ["127.0.0.1"] and seen["x-forwarded-proto"] == ["http"]
    assert seen["x-forwarded-host"] == [client.base_url.netloc.decode()]
    assert "accept-encoding" in seen  # httpx's own, as the client sent it; the proxy adds none
    latin = _seen(await client.get("/http/echo", headers=[(b"x-bytes", b"caf\xe9")]))
    assert latin["x-bytes"] == ["caf\xe9"]  # header bytes cross as they came


async def test_the_upstream_gets_its_own_host_and_no_cookie_the_proxy_kept(client: httpx.AsyncClient, env: Env) -> None:
    first = await client.get("/http/mirror")  # sets a cookie: the proxy's shared client must not keep it
    assert first.status_code == 200
    seen = _seen(await client.get("/http/echo", headers={"Cookie": ""}))
    assert "cookie" not in seen
    [host] = seen["host"]
    assert host.startswith("127.0.0.1:") and host != client.base_url.netloc.decode()


async def test_a_5_mib_upload_is_streamed_not_buffered(client: httpx.AsyncClient, env: Env) -> None:
    chunk = bytes(range(256)) * 256  # 64 KiB
    total = 80 * len(chunk)  # 5 MiB
    digest = hashlib.sha256()

    async def body() -> AsyncIterator[bytes]:
        for i in range(80):
            if i == 16:  # 1 MiB sent: the upstream must have bytes before the client sends the rest
                await asyncio.wait_for(env.upstream.upload_started.wait(), 10)
            digest.update(chunk)
            yield chunk

    answer = await client.post("/http/upload", content=body())
    assert answer.status_code == 200
    assert answer.json() == {"length": total, "sha256": digest.hexdigest()}


async def test_sse_events_arrive_before_the_upstream_finished(client: httpx.AsyncClient, env: Env) -> None:
    async with client.stream("GET", "/http/sse") as answer:
        assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
        chunks = answer.aiter_raw()
        first = await asyncio.wait_for(anext(chunks), 10)  # the upstream holds "two" until released
        assert first == b"data: one\n\n"
        assert not env.upstream.sse_release.is_set()
        env.upstream.sse_release.set()
        rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"data: two\n\n"


async def test_a_client_leaving_an_idle_stream_closes_the_upstream_request(client: httpx.AsyncClient, env: Env) -> None:
    async with client.stream("GET", "/http/sse-idle") as answer:
        assert await asyncio.wait_for(anext(answer.aiter_raw()), 10) == b"data: hello\n\n"
    await asyncio.wait_for(env.upstream.sse_gone.wait(), 10)


async def test_an_upstream_that_breaks_off_cuts_the_client_connection(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/http/break")


async def test_a_closed_port_is_502_port_unreachable(client: httpx.AsyncClient) -> None:
    answer = await client.post("/closed/anything", content=b"x" * 1000)
    assert answer.status_code == 502
    body = answer.json()
    assert body["code"] == "port_unreachable" and "port is not open" in body["error"] and "4242" in body["error"]
    assert body["details"] == {"port": 4242}


async def test_a_path_with_dot_segments_is_refused(env: Env, client: httpx.AsyncClient) -> None:
    encoded = await client.get("/http/echo/%2e%2e/%2E%2E/x")
    assert encoded.status_code == 400 and encoded.json()["code"] == "invalid_argument"
    host, port = env.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /http/../../x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await writer.wait_closed()
    assert raw.startswith(b"HTTP/1.1 400 ")


# --- WebSocket -----------------------------------------------------------------------------------------------


async def test_websocket_text_and_binary_echo(env: Env) -> None:
    async with connect(env.ws + "/echo", proxy=None, max_size=16 << 20) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send(b"\x00\xff" * 10)
        assert await ws.recv() == b"\x00\xff" * 10
        big = bytes(range(256)) * 8192  # 2 MiB: past the websockets default of 1 MiB
        await ws.send(big)
        assert await ws.recv() == big


async def test_websocket_headers_are_filtered_like_http(env: Env) -> None:
    headers = {"Authorization": "Bearer api-key", "X-API-Key": "k", "Cookie": "session=s; keep=1", "X-Keep": "yes"}
    async with connect(
        env.ws + "/h?q=1",
        proxy=None,
        additional_headers=headers,
        origin=cast(Any, "http://site"),
        user_agent_header="ua/2",
    ) as ws:
        await ws.send("ping")
        assert await ws.recv() == "ping"
    seen = env.upstream.ws_requests[-1]
    assert "authorization" not in seen and "x-api-key" not in seen
    assert seen["cookie"] == "keep=1" and seen["x-keep"] == "yes" and seen["x-node-token"] == "node-secret"
    assert seen["origin"] == "http://site" and seen["user-agent"] == "ua/2"
    assert seen["x-forwarded-for"] == "127.0.0.1" and seen["x-forwarded-proto"] == "http"


async def test_websocket_subprotocol_is_negotiated_upstream(env: Env) -> None:
    offered = [Subprotocol("nope"), Subprotocol("chat.v2")]
    async with connect(env.ws + "/s", proxy=None, subprotocols=offered) as ws:
        assert ws.subprotocol == "chat.v2"
    async with connect(env.ws + "/s", proxy=None) as ws:
        assert ws.subprotocol is None


async def test_websocket_close_codes_pass_both_ways(env: Env) -> None:
    async with connect(env.ws + "/c", proxy=None) as ws:
        await ws.send("close:4001:bye now")
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 4001 and ws.close_reason == "bye now"
    assert await asyncio.wait_for(env.upstream.ws_closed.get(), 10) == (4001, "bye now")
    async with connect(env.ws + "/c", proxy=None) as ws:
        await ws.send("x")
        assert await ws.recv() == "x"
        await ws.close(4002, "client done")
    assert await asyncio.wait_for(env.upstream.ws_closed.get(), 10) == (4002, "client done")
    async with connect(env.ws + "/c", proxy=None) as ws:
        await ws.send("die")
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1011  # an abnormal end upstream (1006 cannot be sent) is an internal error here


async def test_websocket_to_a_closed_port_is_refused_with_502(env: Env) -> None:
    url = env.url.replace("http://", "ws://") + "/closed/x"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, proxy=None):
            pass
    response = refused.value.response
    assert response.status_code == 502
    body = json.loads(bytes(response.body or b""))
    assert body["code"] == "port_unreachable" and "port is not open" in body["error"]


async def test_websocket_refused_upstream_answer_is_relayed(env: Env) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(env.ws + "/forbidden", proxy=None):
            pass
    assert refused.value.response.status_code == 403
    assert bytes(refused.value.response.body or b"") == b"no entry here\n"


async def test_websocket_without_the_denial_extension_closes_with_1011(env: Env) -> None:
    url = env.plain_url.replace("http://", "ws://") + "/closed/x"
    async with connect(url, proxy=None) as ws:
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1011 and ws.close_reason is not None and "port is not open" in ws.close_reason
    async with connect(env.plain_url.replace("http://", "ws://") + "/ws/e", proxy=None) as ws:
        await ws.send("still relays")
        assert await ws.recv() == "still relays"


# --- the pieces ----------------------------------------------------------------------------------------------


def _scope(headers: list[tuple[bytes, bytes]], **kw: Any) -> Scope:
    return {"type": "http", "scheme": "https", "client": ("10.0.0.9", 5555), "headers": headers, **kw}


def test_request_headers_trusted_hop_keeps_forwarding_and_appends() -> None:
    headers = [
        (b"host", b"agent:7000"),
        (b"x-forwarded-for", b"1.2.3.4"),
        (b"x-forwarded-proto", b"https"),
        (b"x-forwarded-host", b"api.example"),
        (b"authorization", b"Bearer node-token"),
    ]
    trusted = dict(request_headers(_scope(headers), {}, trust_forwarded=True))
    assert trusted["x-forwarded-for"] == "1.2.3.4, 10.0.0.9"
    assert trusted["x-forwarded-host"] == "api.example" and trusted["x-forwarded-proto"] == "https"
    assert "authorization" not in trusted and "host" not in trusted
    untrusted = dict(request_headers(_scope(headers), {"Authorization": "Bearer t2"}))
    assert untrusted["x-forwarded-for"] == "10.0.0.9" and untrusted["x-forwarded-host"] == "agent:7000"
    assert untrusted["authorization"] == "Bearer t2"


def test_response_headers_drop_connection_named_ones() -> None:
    raw = [(b"Connection", b"close, X-A"), (b"X-A", b"1"), (b"X-B", b"2"), (b"Transfer-Encoding", b"chunked")]
    assert response_headers(raw) == [(b"x-b", b"2")]


@pytest.mark.parametrize("path", ["/../x", "/a/./b", "/%2e%2E/x", "/a/..", "no-slash", "/a\x00b"])
def test_upstream_url_refuses_paths_that_leave_the_target(path: str) -> None:
    with pytest.raises(InvalidArgument):
        upstream_url(PortTarget(url="http://agent:1/agent/v1/sandboxes/s/ports/80"), path, b"")


def test_upstream_url_joins_prefix_path_and_query() -> None:
    target = PortTarget(url="http://agent:1/agent/v1/sandboxes/s/ports/80")
    url = upstream_url(target, "/a%2Fb/c#x", b"q=1")
    assert url == "http://agent:1/agent/v1/sandboxes/s/ports/80/a%2Fb/c%23x?q=1"
    assert upstream_url(PortTarget(url="http://10.0.0.2:8080"), "/", b"", websocket=True) == "ws://10.0.0.2:8080/"


def test_route_suffix_keeps_the_raw_encoding() -> None:
    scope: Scope = {"raw_path": b"/v1/sandboxes/s/ports/80/a%2Fb/", "path": "/v1/sandboxes/s/ports/80/a/b/"}
    assert route_suffix(scope, 5) == "/a%2Fb/"
    assert route_suffix({"raw_path": b"/v1/sandboxes/s/ports/80"}, 5) == "/"


def test_request_headers_send_a_given_host_first_and_once() -> None:
    headers = [(b"host", b"ctl.example:8080"), (b"accept", b"*/*")]
    masked = request_headers(_scope(headers), {}, host="3000-app.example.org")
    assert masked[0] == ("host", "3000-app.example.org") and [n for n, _ in masked].count("host") == 1
    assert dict(masked)["x-forwarded-host"] == "ctl.example:8080"
    assert "host" not in dict(request_headers(_scope(headers), {}))  # the HTTP client's own, by default
