"""The control plane's async HTTP client (httpx over httpcore) asks ``import sniffio`` on every request; with the
package missing each ask is a failed import that walks ``sys.path`` (~0.4 ms of every control plane -> agent
call, measured). ``sniffio`` is a dependency: a request through a real connection looks nothing up."""

from __future__ import annotations

import asyncio
import gc
import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import httpx
import pytest

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


class Recorder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        self.names.append(fullname)
        return None  # the next finders decide


async def test_async_requests_import_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(RESPONSE)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass  # the client closed its connection
        finally:
            writer.close()
            await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    recorder = Recorder()
    async with server, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert (await client.get("/")).text == "ok"  # the client's first request may import its own modules
        monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
        for _ in range(5):
            assert (await client.get("/")).text == "ok"
    assert recorder.names == []
    gc.collect()  # a connection left open would warn here, in this test, not in a later one
