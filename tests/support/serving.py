"""A unit test's app on a real uvicorn server on 127.0.0.1, in the test's event loop (httpx's ASGI transport buffers
whole responses, so anything that streams needs a real server); ``served``: the ``env`` fixture's app served so."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.support.app import Env


def app_of(env: Env) -> FastAPI:
    """The ``create_app`` app behind an ``env``'s ASGI client."""
    transport = env.client._transport
    assert isinstance(transport, httpx.ASGITransport)
    app = transport.app
    assert isinstance(app, FastAPI)
    return app


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """``app`` served until the block ends; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                assert not task.done(), "uvicorn did not start"
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def served(env: Env) -> AsyncIterator[str]:
    """The env's app on a real uvicorn server in this event loop (so responses really stream); its base URL."""
    async with serving(app_of(env)) as url:
        yield url
