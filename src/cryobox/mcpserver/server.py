"""The MCP server object: the tool list (from :mod:`.args`) and the dispatch to :func:`.tools.call_tool`.

``binding`` says, for the request being served, which API and key the tools use: fixed over stdio, the
caller's own on ``/mcp`` (read from the HTTP request the MCP message came in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp import types
from mcp.server.lowlevel import Server

from .. import __version__
from ..errors import CryoboxError
from .args import TOOL_SPECS
from .results import failure
from .tools import ApiBinding, call_tool

SERVER_NAME = "cryobox"
INSTRUCTIONS = (
    "cryobox sandboxes are microVMs restored from snapshots. Create one with create_sandbox, drive it with exec, "
    "run_code, read_file/write_file/list_files, snapshot it and restore or fork_tree from the snapshot, and kill "
    "it when done. Errors carry the API's error body: {error, code, details}."
)

BindingSource = Callable[[Any], ApiBinding]
"""The binding for a request, given the HTTP request it arrived in (``None`` over stdio)."""


def tool_list() -> list[types.Tool]:
    return [types.Tool(name=s.name, description=s.description, inputSchema=s.input_schema()) for s in TOOL_SPECS]


def build_server(binding: BindingSource) -> Server[Any, Any]:
    server: Server[Any, Any] = Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS)

    async def list_tools() -> list[types.Tool]:
        return tool_list()

    async def call(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        # arguments are validated by the tool's own model (an invalid_argument error in the API's shape)
        try:
            bound = binding(server.request_context.request)
        except CryoboxError as err:
            return failure(err)
        return await call_tool(bound, name, arguments)

    server.list_tools()(list_tools)  # type: ignore[no-untyped-call]
    server.call_tool(validate_input=False)(call)
    return server
