"""The MCP tools without an API server: the tool list and schemas, argument validation (nothing is sent), the
mapping of API errors to tool errors (the API's body, its stable code), and the key never leaving in a result."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import types

from cryobox.errors import InvalidArgument
from cryobox.mcpserver.args import TOOL_SPECS
from cryobox.mcpserver.server import tool_list
from cryobox.mcpserver.tools import ApiBinding, call_tool, decode_content
from tests.support.mcp import TOOLS

KEY = "cbx_secret_key_0123456789"
SANDBOX = {
    "id": "sbx_1",
    "template": "base",
    "cpu": 1,
    "memory_mb": 256,
    "status": "running",
    "boot_ms": 1.0,
    "boot_mode": "restore",
    "created_at": "2026-01-01T00:00:00Z",
}


class Recorder:
    """A mock API: ``answer`` says how to respond; every request is kept."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def binding(self) -> ApiBinding:
        def handler(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return self.answer(request)

        def open_client() -> httpx.AsyncClient:
            return httpx.AsyncClient(
                transport=httpx.MockTransport(handler),
                base_url="http://api",
                headers={"Authorization": f"Bearer {KEY}"},
            )

        return ApiBinding(api_url="http://api", api_key=KEY, open_client=open_client)


def never(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"no request expected, got {request.method} {request.url}")


def body(result: types.CallToolResult) -> dict[str, Any]:
    """The structured content, checked to be the same as the JSON text content."""
    assert result.structuredContent is not None
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    assert json.loads(result.content[0].text) == result.structuredContent
    return result.structuredContent


def test_the_tool_list_is_complete_and_every_argument_is_described() -> None:
    tools = tool_list()
    assert {t.name for t in tools} == TOOLS and len(tools) == len(TOOLS)
    for tool in tools:
        assert tool.description
        schema = tool.inputSchema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
    required = {t.name: set(t.inputSchema.get("required", [])) for t in tools}
    assert required["exec"] == {"sandbox_id", "command"}
    assert required["restore"] == {"snapshot_id"}
    assert required["create_sandbox"] == set() and required["list_sandboxes"] == set()


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("exec", {"sandbox_id": "sbx_1"}, "command"),
        ("exec", {"sandbox_id": "sbx_1", "command": "true", "timeout_seconds": 0}, "timeout_seconds"),
        ("exec", {"sandbox_id": "sbx_1", "command": "true", "shell": "bash"}, "shell"),
        ("fork_tree", {"sandbox_id": "sbx_1", "count": 17}, "count"),
        ("create_sandbox", {"ttl_seconds": -1}, "ttl_seconds"),
        ("create_sandbox", {"metadata": {"a": 1}}, "metadata.a"),
        ("read_file", {"sandbox_id": "sbx_1", "path": "/x", "encoding": "latin-1"}, "encoding"),
        ("run_code", {"sandbox_id": "sbx_1", "code": "1", "language": "r"}, "language"),
        ("kill", {}, "sandbox_id"),
        ("kill", {"sandbox_id": ""}, "sandbox_id"),
    ],
)
async def test_bad_arguments_are_an_invalid_argument_error_and_send_nothing(
    tool: str, arguments: dict[str, Any], field: str
) -> None:
    api = Recorder(never)
    result = await call_tool(api.binding(), tool, arguments)
    assert result.isError
    error = body(result)
    assert error["code"] == "invalid_argument" and error["error"].startswith(f"invalid arguments for {tool}: ")
    assert field in [e["field"] for e in error["details"]["errors"]], error
    assert api.requests == []


async def test_an_unknown_tool_is_not_found() -> None:
    result = await call_tool(Recorder(never).binding(), "format_disk", {})
    assert result.isError and body(result)["code"] == "not_found"


async def test_bad_base64_is_refused_before_anything_is_sent() -> None:
    api = Recorder(never)
    args = {"sandbox_id": "sbx_1", "path": "/x", "content": "not base64!", "encoding": "base64"}
    result = await call_tool(api.binding(), "write_file", args)
    assert result.isError and body(result)["code"] == "invalid_argument" and api.requests == []
    assert decode_content("aGk=", "base64") == b"hi" and decode_content("hé", "utf-8") == "hé".encode()
    with pytest.raises(InvalidArgument):
        decode_content("a", "base64")


@pytest.mark.parametrize(
    ("status", "code", "details"),
    [
        (404, "not_found", {"id": "sbx_9"}),
        (429, "quota_exceeded", {"resource": "sandboxes", "limit": 1, "used": 1, "requested": 1}),
        (409, "wrong_state", {"state": "paused", "required": "running"}),
        (400, "invalid_argument", {}),
    ],
)
async def test_an_api_error_is_a_tool_error_with_the_apis_body(status: int, code: str, details: dict[str, Any]) -> None:
    wire = {"error": f"the API said {code}", "code": code, "details": details}
    api = Recorder(lambda request: httpx.Response(status, json=wire))
    result = await call_tool(api.binding(), "exec", {"sandbox_id": "sbx_9", "command": "true"})
    assert result.isError
    assert body(result) == wire
    assert len(api.requests) == 1 and api.requests[0].url.path == "/v1/sandboxes/sbx_9/exec"  # the one request


async def test_the_key_never_leaves_in_a_result_or_an_error() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=SANDBOX)
        out = {"stdout": f"KEY={KEY}\n", "stderr": "", "exit_code": 0, "duration_ms": 1.0}
        return httpx.Response(200, json=out)

    result = await call_tool(Recorder(answer).binding(), "exec", {"sandbox_id": "sbx_1", "command": "env"})
    assert not result.isError
    assert body(result)["stdout"] == "KEY=[redacted]\n" and body(result)["exit_code"] == 0

    wire = {"error": f"bad key {KEY}", "code": "unauthorized", "details": {"key": KEY}}
    failed = await call_tool(
        Recorder(lambda r: httpx.Response(401, json=wire)).binding(), "list_sandboxes", {"status": "running"}
    )
    assert failed.isError and KEY not in failed.model_dump_json()
    assert body(failed) == {"error": "bad key [redacted]", "code": "unauthorized", "details": {"key": "[redacted]"}}


async def test_an_unexpected_failure_is_internal_without_its_text() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise RuntimeError(f"boom {KEY}")

    result = await call_tool(Recorder(answer).binding(), "kill", {"sandbox_id": "sbx_1"})
    assert result.isError
    assert body(result) == {"error": "internal error (RuntimeError)", "code": "internal", "details": {}}


async def test_results_are_plain_json_objects() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/snapshots"):
            assert json.loads(request.content)["labels"] == {"step": "1", "label": "before"}
            snap = {"id": "snp_1", "sandbox_id": "sbx_1", "template": "base", "size_bytes": 5}
            return httpx.Response(201, json={**snap, "created_at": "2026-01-01T00:00:00Z", "labels": {}})
        return httpx.Response(200, json=SANDBOX)

    args = {"sandbox_id": "sbx_1", "label": "before", "labels": {"step": "1"}}
    result = await call_tool(Recorder(answer).binding(), "snapshot", args)
    assert not result.isError, result
    snap = body(result)
    assert snap["id"] == "snp_1" and snap["created_at"].startswith("2026-01-01")


def test_every_spec_has_a_runner() -> None:
    from cryobox.mcpserver.tools import RUNNERS

    assert set(RUNNERS) == {s.name for s in TOOL_SPECS} == TOOLS
