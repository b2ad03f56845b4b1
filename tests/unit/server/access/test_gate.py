"""The API gate: key checked before the body is read, JSON capped at 1 MiB, bad keys rate limited per address."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from cryobox.server.access.gate import MAX_JSON_BYTES, AuthGateMiddleware, FailedAuth, bearer
from tests.support.clock import FakeClock


class App:
    """Reads the whole body and echoes its size; counts every receive() it makes."""

    def __init__(self) -> None:
        self.reads = 0
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        size, more = 0, True
        while more:
            message = await receive()
            self.reads += 1
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


async def _authenticate(key: str) -> object | None:
    return object() if key == "good" else None


def _client(app: App, failures: FailedAuth | None = None) -> httpx.AsyncClient:
    gate = AuthGateMiddleware(app, authenticate=_authenticate, failures=failures)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t")


GOOD = {"Authorization": "Bearer good"}


async def test_no_key_is_refused_before_the_body_is_read() -> None:
    app = App()
    async with _client(app) as client:
        response = await client.post("/v1/sandboxes", content=b"{" + b" " * (2 << 20) + b"}")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"
    assert app.calls == 0 and app.reads == 0


async def test_bad_keys_from_one_address_are_rate_limited_until_the_bucket_refills() -> None:
    clock, app = FakeClock(1000.0), App()
    failures = FailedAuth(burst=5, per_s=1.0, clock=clock)
    async with _client(app, failures) as client:
        codes = [(await client.get("/v1/info", headers={"Authorization": "Bearer bad"})).status_code for _ in range(8)]
        assert codes == [401] * 5 + [429] * 3
        assert (await client.get("/v1/info", headers=GOOD)).status_code == 429  # the address, whatever the key
        clock.now += 2.0  # two tokens back
        assert (await client.get("/v1/info", headers=GOOD)).status_code == 200
    assert app.calls == 1


async def test_json_bodies_are_capped_but_uploads_are_not() -> None:
    app = App()
    big = b"x" * (MAX_JSON_BYTES + 1)
    async with _client(app) as client:
        refused = await client.post("/v1/sandboxes", content=big, headers=GOOD)
        assert refused.status_code == 413 and refused.json()["details"]["limit"] == MAX_JSON_BYTES
        assert app.calls == 0  # refused on its content-length, before the app saw it

        async def chunks() -> Any:  # no content-length: the cap applies as the body streams in
            for _ in range(3):
                yield b"y" * (MAX_JSON_BYTES // 2)

        streamed = await client.post("/v1/sandboxes", content=chunks(), headers=GOOD)
        assert streamed.status_code == 413
        upload = await client.put("/v1/sandboxes/sb-1/fs", content=big, headers=GOOD)
        assert upload.status_code == 200 and upload.text == str(len(big))
        fits = await client.post("/v1/sandboxes", content=b"{}", headers=GOOD)
        assert fits.status_code == 200


async def test_public_and_node_routes_need_no_key() -> None:
    app = App()
    async with _client(app) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/internal/v1/heartbeat", content=b"{}")).status_code == 200
        assert (await client.get("/metrics")).status_code == 401
    assert app.calls == 2


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ([(b"authorization", b"Bearer k1")], "k1"),
        ([(b"authorization", b"bearer  k2 ")], "k2"),
        ([(b"x-api-key", b"k3")], "k3"),
        ([(b"authorization", b"Basic abc")], None),
        ([(b"authorization", b"Bearer ")], None),
        ([], None),
    ],
)
def test_bearer(headers: list[tuple[bytes, bytes]], key: str | None) -> None:
    assert bearer(headers) == key
