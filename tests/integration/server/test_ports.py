"""A server started inside a sandbox is reachable from the host through the control plane, HTTP and WebSocket,
in every style: cryobox's ``/v1/sandboxes/{id}/ports/{port}/…``, PandaStack's ``…/proxy/{port}/…`` and E2B's
sandbox URL (``E2b-Sandbox-Id`` / ``E2b-Sandbox-Port``). The guest never sees the caller's credentials."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from tests.support.paths import APPS

WS_ECHO = APPS / "ws_echo.py"
HTTP_PORT, WS_PORT = 8000, 8765
PAGE = "<h1>served from inside the guest</h1>\n" * 100


@pytest.fixture(scope="module")
def servers(server: ServeProcess) -> Iterator[tuple[Sandbox, str]]:
    """A sandbox running ``python3 -m http.server`` and a WebSocket echo server; yields it and its envd token."""
    sbx = Sandbox.create(template="base", api_url=server.url, api_key=server.api_key)
    try:
        sbx.filesystem.write("/srv/www/index.html", PAGE)
        sbx.filesystem.write("/srv/www/sub/a.txt", "a")
        sbx.filesystem.write("/root/ws_echo.py", WS_ECHO.read_bytes())
        sbx.exec(
            f"setsid nohup python3 -m http.server {HTTP_PORT} --directory /srv/www >/dev/null 2>&1 < /dev/null & "
            f"setsid nohup python3 /root/ws_echo.py {WS_PORT} >/dev/null 2>&1 < /dev/null &"
        )
        token = httpx.get(f"{server.url}/e2b/sandboxes/{sbx.id}", headers={"X-API-Key": server.api_key}).json()[
            "envdAccessToken"
        ]
        deadline = time.monotonic() + 60
        url = f"{server.url}/v1/sandboxes/{sbx.id}/ports/{HTTP_PORT}/index.html"
        auth = {"Authorization": f"Bearer {server.api_key}"}
        while httpx.get(url, headers=auth).status_code != 200:  # python starts slowly under TCG
            assert time.monotonic() < deadline, "the guest's http.server never came up"
            time.sleep(0.3)
        yield sbx, token
    finally:
        sbx.kill()


def test_http_through_every_style(server: ServeProcess, servers: tuple[Sandbox, str]) -> None:
    sbx, token = servers
    auth = {"Authorization": f"Bearer {server.api_key}"}
    for style in ("ports", "proxy"):
        got = httpx.get(f"{server.url}/v1/sandboxes/{sbx.id}/{style}/{HTTP_PORT}/index.html", headers=auth)
        assert got.status_code == 200 and got.text == PAGE, (style, got.status_code)
        assert got.headers["content-type"].startswith("text/html")
    listing = httpx.get(f"{server.url}/v1/sandboxes/{sbx.id}/ports/{HTTP_PORT}/sub/?x=1", headers=auth)
    assert listing.status_code == 200 and "a.txt" in listing.text  # the directory listing, query passed
    refused = httpx.post(f"{server.url}/v1/sandboxes/{sbx.id}/ports/{HTTP_PORT}/index.html", headers=auth, content=b"x")
    assert refused.status_code == 501  # http.server's own answer to a POST, passed through
    e2b = {"E2b-Sandbox-Id": sbx.id, "E2b-Sandbox-Port": str(HTTP_PORT), "X-Access-Token": token}
    got = httpx.get(f"{server.url}/e2b/sandbox/index.html", headers=e2b)
    assert got.status_code == 200 and got.text == PAGE


def test_refusals(server: ServeProcess, servers: tuple[Sandbox, str]) -> None:
    sbx, token = servers
    base = f"{server.url}/v1/sandboxes/{sbx.id}/ports"
    assert httpx.get(f"{base}/{HTTP_PORT}/index.html").status_code == 401  # no key
    closed = httpx.get(f"{base}/9/", headers={"Authorization": f"Bearer {server.api_key}"})
    assert closed.status_code == 502 and closed.json()["code"] == "port_unreachable"
    assert "port is not open" in closed.json()["error"]
    wrong = {"E2b-Sandbox-Id": sbx.id, "E2b-Sandbox-Port": str(HTTP_PORT), "X-Access-Token": token + "x"}
    assert httpx.get(f"{server.url}/e2b/sandbox/index.html", headers=wrong).status_code == 401


async def _echo(url: str, headers: dict[str, str]) -> tuple[str, bytes, int | None, str]:
    async with connect(url, additional_headers=headers, subprotocols=[Subprotocol("echo.v1")], proxy=None) as ws:
        assert ws.response is not None
        seen_auth = ws.response.headers.get("X-Seen-Authorization", "")
        await ws.send("hello over the proxy")
        text = await ws.recv()
        blob = bytes(range(256)) * 300
        await ws.send(blob)
        binary = await ws.recv()
        assert ws.subprotocol == "echo.v1"
        await ws.close(code=4001, reason="done")
    assert isinstance(text, str) and isinstance(binary, bytes) and binary == blob
    return text, binary[:4], ws.close_code, seen_auth


def test_websocket_through_every_style(server: ServeProcess, servers: tuple[Sandbox, str]) -> None:
    sbx, token = servers
    ws_base = server.url.replace("http://", "ws://")
    auth = {"Authorization": f"Bearer {server.api_key}"}
    for style in ("ports", "proxy"):
        text, _, code, seen = asyncio.run(_echo(f"{ws_base}/v1/sandboxes/{sbx.id}/{style}/{WS_PORT}/echo", auth))
        assert text == "hello over the proxy" and code == 4001, style
        assert seen == "-", "the caller's API key must never reach the guest"
    e2b = {"E2b-Sandbox-Id": sbx.id, "E2b-Sandbox-Port": str(WS_PORT), "X-Access-Token": token}
    text, _, code, seen = asyncio.run(_echo(f"{ws_base}/e2b/sandbox/echo", e2b))
    assert text == "hello over the proxy" and code == 4001 and seen == "-"

    async def unauthenticated() -> None:
        async with connect(f"{ws_base}/v1/sandboxes/{sbx.id}/ports/{WS_PORT}/echo", proxy=None):
            pass

    with pytest.raises(InvalidStatus) as refused:
        asyncio.run(unauthenticated())
    assert refused.value.response.status_code == 401
