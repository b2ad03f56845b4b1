"""The API's listeners (``compose/listeners.py``): with an operator's certificate an HTTPS listener serves the same
app beside the plain one (one lifespan), stops with it, and a bad certificate or a taken port stops the start."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from cryobox.compose.listeners import http_server, serve, tls_listener
from cryobox.errors import InvalidArgument
from tests.support.internet_tls import Authority


class App:
    """Answers every request with its scheme; counts lifespan startups."""

    def __init__(self) -> None:
        self.startups = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.startups += 1
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(scope["scheme"]).encode()})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority("listeners", tmp_path)


@contextlib.asynccontextmanager
async def running(app: App, cert: tuple[Path, Path]) -> AsyncIterator[tuple[int, int, asyncio.Task[None]]]:
    port, https_port = free_port(), free_port()
    primary = http_server(app, "127.0.0.1", port)
    tls = tls_listener(*cert, "127.0.0.1", https_port)
    task = asyncio.create_task(serve(primary, tls))
    try:
        yield port, https_port, task
    finally:
        primary.should_exit = True
        await asyncio.wait_for(task, 10)


async def until_up(url: str, **kw: object) -> httpx.Response:
    async with httpx.AsyncClient(**kw) as client:  # type: ignore[arg-type]
        for _ in range(200):
            with contextlib.suppress(httpx.TransportError):
                return await client.get(url)
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


async def test_https_beside_http_one_lifespan_both_stop(authority: Authority) -> None:
    app = App()
    trust = ssl.create_default_context(cafile=authority.file)
    async with running(app, authority.issue(["*.cbx.test"], ["127.0.0.1"])) as (port, https_port, task):
        assert (await until_up(f"http://127.0.0.1:{port}/")).text == "http"
        assert (await until_up(f"https://127.0.0.1:{https_port}/", verify=trust)).text == "https"
        async with httpx.AsyncClient() as untrusting:  # it is TLS, with the operator's certificate
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.get(f"https://127.0.0.1:{https_port}/")
        assert app.startups == 1
    assert task.done() and task.exception() is None
    for gone in (port, https_port):
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", gone), timeout=1):
            pass


async def test_a_taken_https_port_fails_before_anything_serves(authority: Authority) -> None:
    app = App()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        primary = http_server(app, "127.0.0.1", free_port())
        tls = tls_listener(*authority.issue(["x.test"]), "127.0.0.1", taken.getsockname()[1])
        with pytest.raises(InvalidArgument, match="cannot listen"):
            await serve(primary, tls)
    assert not primary.started and app.startups == 0


def test_the_certificate_and_key_are_checked_at_start(authority: Authority, tmp_path: Path) -> None:
    assert tls_listener(None, None, "127.0.0.1") is None
    cert, key = authority.issue(["x.test"])
    listener = tls_listener(cert, key, "0.0.0.0")
    assert listener is not None and listener.port == 443 and listener.cert == cert
    with pytest.raises(InvalidArgument, match="go together"):
        tls_listener(cert, None, "127.0.0.1")
    _, other_key = authority.issue(["y.test"])
    with pytest.raises(InvalidArgument, match="cannot use TLS certificate"):
        tls_listener(cert, other_key, "127.0.0.1")
    with pytest.raises(InvalidArgument, match="cannot use TLS certificate"):
        tls_listener(tmp_path / "missing.pem", key, "127.0.0.1")
