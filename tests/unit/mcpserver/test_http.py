"""``/mcp`` on the control plane app over a fake agent (no VMs): the ``mcp`` SDK's streamable HTTP client drives
the tools; the gate's 401s, keys in the URL, workspace scoping and quotas apply to them as to the API itself."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from cryobox.mcpserver.http import McpEndpoint
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimiter
from tests.support.app import Env, agent, env, limits, quota, registry
from tests.support.metrics import requests_total
from tests.support.serving import app_of

__all__ = ["agent", "env", "quota", "registry"]

BASE = "http://ctl"


def endpoint(app: FastAPI) -> McpEndpoint:
    mcp = app.state.mcp
    assert isinstance(mcp, McpEndpoint)
    return mcp


@contextlib.asynccontextmanager
async def session(app: FastAPI, key: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP session over streamable HTTP to ``app``'s ``/mcp`` with ``key`` (the app's lifespan is
    not run by the ASGI transport: the endpoint's is entered here)."""
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=BASE, headers={"Authorization": f"Bearer {key}"}
    )
    async with endpoint(app).run(), http, streamable_http_client(f"{BASE}/mcp", http_client=http) as streams:
        read, write, _ = streams
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            yield mcp


async def call(mcp: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await mcp.call_tool(tool, arguments)
    assert not result.isError, result.content
    assert result.structuredContent is not None
    return result.structuredContent


async def fails(mcp: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await mcp.call_tool(tool, arguments)
    assert result.isError, result
    assert result.structuredContent is not None
    first = result.content[0]
    assert isinstance(first, types.TextContent) and json.loads(first.text) == result.structuredContent
    return result.structuredContent


def key_of(registry: Registry, workspace: str) -> str:
    _, key = registry.create_key(registry.ensure_workspace(workspace).id)
    return key


async def test_the_tools_over_http_act_as_the_caller(env: Env) -> None:
    app = app_of(env)
    key = key_of(env.registry, "alpha")
    async with session(app, key) as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
        assert {"create_sandbox", "exec", "run_code", "kill", "restore", "fork_tree"} <= names and len(names) == 12
        made = await call(mcp, "create_sandbox", template="base", metadata={"job": "mcp"}, ttl_seconds=600)
        sid = made["id"]
        assert made["metadata"] == {"job": "mcp"} and env.rows() == 1
        ran = await call(mcp, "exec", sandbox_id=sid, command="echo hi")
        assert set(ran) >= {"exit_code", "stdout", "stderr"}
        data = bytes(range(256))
        wrote = await call(
            mcp,
            "write_file",
            sandbox_id=sid,
            path="/work/b.bin",
            content=base64.b64encode(data).decode(),
            encoding="base64",
        )
        assert wrote["bytes"] == 256
        read = await call(mcp, "read_file", sandbox_id=sid, path="/work/b.bin", encoding="base64")
        assert base64.b64decode(read["content"]) == data and read["size"] == 256
        text = await fails(mcp, "read_file", sandbox_id=sid, path="/work/b.bin")
        assert text["code"] == "invalid_argument"  # not UTF-8
        listed = await call(mcp, "list_sandboxes", metadata={"job": "mcp"})
        assert [s["id"] for s in listed["sandboxes"]] == [sid]
        snap = await call(mcp, "snapshot", sandbox_id=sid, label="one", retain=True)
        assert snap["sandbox_id"] == sid and snap["labels"] == {"label": "one"} and snap["retain"] is True
        labelled = await call(mcp, "list_snapshots", labels={"label": "one"})
        assert [s["id"] for s in labelled["snapshots"]] == [snap["id"]]
        restored = await call(mcp, "restore", snapshot_id=snap["id"], metadata={"job": "restored"})
        assert restored["from_snapshot"] == snap["id"] and restored["id"] != sid
        tree = await call(mcp, "fork_tree", sandbox_id=sid, count=2)
        assert tree["parent_id"] == sid and len(tree["children"]) == 2 and tree["errors"] == []
        assert env.rows() == 4
        for child in [restored, *tree["children"]]:
            await call(mcp, "kill", sandbox_id=child["id"])
        missing = await fails(mcp, "exec", sandbox_id="sbx_nope", command="true")
        assert missing["code"] == "not_found" and missing["error"]
        gone = await call(mcp, "kill", sandbox_id=sid)
        assert gone == {"id": sid, "killed": True}
        assert (await call(mcp, "list_sandboxes"))["sandboxes"] == []
        again = await fails(mcp, "kill", sandbox_id=sid)
        assert again["code"] == "not_found"
    # the MCP requests and the API requests their tools made are both counted, each under its own route
    assert requests_total(env.control.metrics, "/mcp", "POST", "200") >= 10
    assert requests_total(env.control.metrics, "/v1/sandboxes/{sandbox_id}/exec", "POST", "404") == 1


async def test_another_workspace_cannot_see_or_kill_the_sandbox(env: Env) -> None:
    app = app_of(env)
    sid = await env.made()  # alpha's, through the API
    other = key_of(env.registry, "beta")
    async with session(app, other) as mcp:
        assert (await call(mcp, "list_sandboxes"))["sandboxes"] == []
        assert (await fails(mcp, "kill", sandbox_id=sid))["code"] == "not_found"
        assert (await fails(mcp, "exec", sandbox_id=sid, command="id"))["code"] == "not_found"
    assert env.rows() == 1  # still there


@limits(sandboxes=1)
async def test_a_quota_refusal_is_a_tool_error_with_its_code(env: Env) -> None:
    await env.made()
    async with session(app_of(env), key_of(env.registry, "alpha")) as mcp:
        refused = await fails(mcp, "create_sandbox", template="base")
    assert refused["code"] == "quota_exceeded" and refused["details"]["resource"] == "sandboxes"
    assert env.rows() == 1


async def test_no_key_a_bad_key_or_a_key_in_the_url_is_401_in_the_apis_shape(env: Env) -> None:
    app = app_of(env)
    good = key_of(env.registry, "alpha")
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with endpoint(app).run(), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
        for auth in ({}, {"Authorization": "Bearer cbx_wrong"}):
            response = await http.post("/mcp", json=hello, headers={**headers, **auth})
            assert response.status_code == 401, response.text
            assert response.json()["code"] == "unauthorized" and response.headers["www-authenticate"] == "Bearer"
        in_url = await http.post(f"/mcp?api_key={good}", json=hello, headers=headers)
        assert in_url.status_code == 401 and in_url.json()["code"] == "unauthorized"
        both = await http.post(f"/mcp?token={good}", json=hello, headers={**headers, "Authorization": f"Bearer {good}"})
        assert both.status_code == 401 and good not in both.text


async def test_outside_the_lifespan_the_endpoint_answers_503(env: Env) -> None:
    response = await env.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert response.status_code == 503 and response.json()["code"] == "capacity"


async def test_a_tool_call_spends_one_token_of_the_callers_own_rate_limit(env: Env) -> None:
    app = app_of(env)
    app.state.ctx.limiter = RateLimiter(rate_per_s=0.001, burst=4, clock=lambda: 1000.0)  # no refill in the test
    sid = await env.made()  # token 1, through the API
    async with session(app, key_of(env.registry, "alpha")) as mcp:  # initialize and list_tools spend none
        assert (await call(mcp, "list_sandboxes"))["sandboxes"][0]["id"] == sid  # token 2
        await call(mcp, "exec", sandbox_id=sid, command="true")  # token 3: no lookup before the exec
        assert (await env.client.get(f"/v1/sandboxes/{sid}")).status_code == 200  # token 4, the same bucket
        limited = await fails(mcp, "exec", sandbox_id=sid, command="true")
        assert limited["code"] == "rate_limited"
    async with session(app, key_of(env.registry, "beta")) as other:  # another workspace: its own bucket
        assert (await call(other, "list_sandboxes"))["sandboxes"] == []
