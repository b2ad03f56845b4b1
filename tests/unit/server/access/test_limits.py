"""``BodyLimitMiddleware``: a body past the limit is a 413 (by its declared length, or as it streams) before the app
has it; a route named in ``own_limits`` gets its whole body (it caps the body itself)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.types import Receive, Scope, Send

from cryobox.server.access.limits import BodyLimitMiddleware


async def echo_size(scope: Scope, receive: Receive, send: Send) -> None:
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(size).encode()})


async def test_bodies_past_the_limit_are_refused_unless_the_route_caps_its_own() -> None:
    app = BodyLimitMiddleware(echo_size, max_bytes=100, own_limits=frozenset({("POST", "/v1/templates/build")}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.post("/v1/sandboxes", content=b"x" * 100)).text == "100"
        declared = await http.post("/v1/sandboxes", content=b"x" * 101)
        assert declared.status_code == 413 and declared.json()["details"]["limit"] == 100

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"y" * 60

        streamed = await http.post("/v1/sandboxes", content=chunks())
        assert streamed.status_code == 413
        own = await http.post("/v1/templates/build", content=b"z" * 1000)
        assert own.status_code == 200 and own.text == "1000"
        assert (await http.put("/v1/templates/build", content=b"z" * 1000)).status_code == 413
