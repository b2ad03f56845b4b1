"""The MCP server on real VMs through the ``mcp`` SDK's own clients: ``cryobox mcp`` over stdio and ``/mcp`` over
streamable HTTP each run create → exec → write/read file → snapshot → restore (the restored sandbox sees what was
written before the snapshot, not after) → kill; HTTP also refuses missing and wrong keys and keeps another
workspace's key away from the sandbox; ``run_code`` runs a cell in a code-interpreter sandbox."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from cryobox.bench.server import ServeProcess
from tests.support.mcp import TOOLS  # the full tool set, asserted once in one place
from tests.support.serve import new_key

PAYLOAD = bytes(range(256)) + b"\xff\xfe not utf-8 \x00"


@pytest.fixture
def made(server: ServeProcess) -> Iterator[list[str]]:
    """Ids of sandboxes a test created through MCP: deleted through the API afterwards, whatever happened."""
    ids: list[str] = []
    yield ids
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.api_key}"}) as http:
        for sandbox_id in ids:
            response = http.delete(f"/v1/sandboxes/{sandbox_id}", timeout=120)
            assert response.status_code in (204, 404), response.text


@contextlib.asynccontextmanager
async def over_stdio(server: ServeProcess) -> AsyncIterator[ClientSession]:
    env = {**os.environ, "CRYOBOX_API_URL": server.url, "CRYOBOX_API_KEY": server.api_key}
    params = StdioServerParameters(command=sys.executable, args=["-m", "cryobox.cli.main", "mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        yield mcp


@contextlib.asynccontextmanager
async def over_http(server: ServeProcess, key: str) -> AsyncIterator[ClientSession]:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx.Timeout(300, connect=10))
    async with http, streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, _):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            yield mcp


def structured(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structuredContent is not None
    text = result.content[0]
    assert isinstance(text, types.TextContent) and json.loads(text.text) == result.structuredContent
    return result.structuredContent


async def call(mcp: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await mcp.call_tool(tool, arguments)
    assert not result.isError, f"{tool}: {result.content}"
    return structured(result)


async def fails(mcp: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await mcp.call_tool(tool, arguments)
    assert result.isError, f"{tool} should have failed: {result.content}"
    return structured(result)


async def flow(
    mcp: ClientSession, made: list[str], while_alive: Callable[[str], Awaitable[None]] | None = None
) -> None:
    """create → exec → write/read → snapshot → restore → kill, asserting each effect."""
    assert {t.name for t in (await mcp.list_tools()).tools} == TOOLS
    created = await call(mcp, "create_sandbox", template="base", ttl_seconds=900, metadata={"via": "mcp"})
    sid = created["id"]
    made.append(sid)
    assert created["status"] == "running" and created["metadata"] == {"via": "mcp"}

    ran = await call(mcp, "exec", sandbox_id=sid, command="echo hello-mcp; echo oops >&2; exit 3", timeout_seconds=30)
    assert (ran["exit_code"], ran["stdout"], ran["stderr"]) == (3, "hello-mcp\n", "oops\n")
    encoded = base64.b64encode(PAYLOAD).decode()
    wrote = await call(mcp, "write_file", sandbox_id=sid, path="/tmp/mcp/data.bin", content=encoded, encoding="base64")
    assert wrote["bytes"] == len(PAYLOAD)
    back = await call(mcp, "read_file", sandbox_id=sid, path="/tmp/mcp/data.bin", encoding="base64")
    assert base64.b64decode(back["content"]) == PAYLOAD
    await call(mcp, "write_file", sandbox_id=sid, path="/tmp/mcp/note.txt", content="héllo\n")
    assert (await call(mcp, "read_file", sandbox_id=sid, path="/tmp/mcp/note.txt"))["content"] == "héllo\n"
    entries = {e["name"]: e for e in (await call(mcp, "list_files", sandbox_id=sid, path="/tmp/mcp"))["entries"]}
    assert entries["data.bin"]["size"] == len(PAYLOAD) and not entries["data.bin"]["is_dir"]

    snap = await call(mcp, "snapshot", sandbox_id=sid, label="before")
    assert snap["sandbox_id"] == sid and snap["labels"].get("label") == "before"
    listed = await call(mcp, "list_snapshots", sandbox_id=sid)
    assert snap["id"] in [s["id"] for s in listed["snapshots"]]
    await call(mcp, "write_file", sandbox_id=sid, path="/tmp/mcp/after.txt", content="after the snapshot")

    restored = await call(mcp, "restore", snapshot_id=snap["id"], ttl_seconds=900)
    rid = restored["id"]
    made.append(rid)
    assert rid != sid and restored["from_snapshot"] == snap["id"]
    seen = await call(mcp, "read_file", sandbox_id=rid, path="/tmp/mcp/data.bin", encoding="base64")
    assert base64.b64decode(seen["content"]) == PAYLOAD
    later = await call(mcp, "exec", sandbox_id=rid, command="test -e /tmp/mcp/after.txt")
    assert later["exit_code"] == 1  # written after the snapshot: not in the restored sandbox

    if while_alive is not None:
        await while_alive(sid)
    missing = await fails(mcp, "exec", sandbox_id="sbx_does_not_exist", command="true")
    assert missing["code"] == "not_found" and missing["error"]

    for sandbox_id in (rid, sid):
        assert await call(mcp, "kill", sandbox_id=sandbox_id) == {"id": sandbox_id, "killed": True}
    alive = {s["id"] for s in (await call(mcp, "list_sandboxes"))["sandboxes"]}
    assert sid not in alive and rid not in alive


async def test_stdio(server: ServeProcess, made: list[str]) -> None:
    async with over_stdio(server) as mcp:
        await flow(mcp, made)


async def test_http(server: ServeProcess, made: list[str]) -> None:
    other = new_key(server.data_dir, "mcp-other")

    async def other_workspace_cannot_touch(sid: str) -> None:
        async with over_http(server, other) as intruder:
            assert sid not in {s["id"] for s in (await call(intruder, "list_sandboxes"))["sandboxes"]}
            assert (await fails(intruder, "kill", sandbox_id=sid))["code"] == "not_found"
            assert (await fails(intruder, "exec", sandbox_id=sid, command="id"))["code"] == "not_found"
        async with over_http(server, server.api_key) as owner:  # still there, still answering
            assert (await call(owner, "exec", sandbox_id=sid, command="echo alive"))["stdout"] == "alive\n"
            not_code = await fails(owner, "run_code", sandbox_id=sid, code="1")
            assert not_code["code"] == "wrong_state"  # a base sandbox runs no code interpreter

    async with over_http(server, server.api_key) as mcp:
        await flow(mcp, made, other_workspace_cannot_touch)

    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=server.url) as http:
        for auth in ({}, {"Authorization": "Bearer cbx_not_a_key"}):
            refused = await http.post("/mcp", json=hello, headers={**accept, **auth})
            assert refused.status_code == 401 and refused.json()["code"] == "unauthorized", refused.text
        in_url = await http.post(f"/mcp?api_key={server.api_key}", json=hello, headers=accept)
        assert in_url.status_code == 401 and server.api_key not in in_url.text


async def test_run_code(server: ServeProcess, made: list[str]) -> None:
    async with over_http(server, server.api_key) as mcp:
        created = await call(mcp, "create_sandbox", template="code-interpreter", ttl_seconds=900)
        made.append(created["id"])
        cell = await call(mcp, "run_code", sandbox_id=created["id"], code="x = 6 * 7\nprint('out')\nx")
        assert cell["text"] == "42" and cell["stdout"] == "out\n" and cell["error"] is None
        assert any(r.get("is_main_result") and r.get("text") == "42" for r in cell["results"])
        raised = await call(mcp, "run_code", sandbox_id=created["id"], code="raise ValueError('bad ' + str(x))")
        assert raised["error"]["name"] == "ValueError" and "bad 42" in raised["error"]["value"]
        await call(mcp, "kill", sandbox_id=created["id"])
