"""``cryobox mcp``: the MCP server over stdio, a pure client of the API at ``$CRYOBOX_API_URL`` with the key
``$CRYOBOX_API_KEY`` (resolved exactly as the SDK resolves them: :meth:`cryobox.sdk.ClientConfig.resolve`)."""

from __future__ import annotations

from mcp.server.stdio import stdio_server

from ..sdk import ClientConfig
from .server import build_server
from .tools import ApiBinding


def stdio_binding(config: ClientConfig) -> ApiBinding:
    return ApiBinding(api_url=config.api_url, api_key=config.api_key, open_client=config.async_client)


async def serve_stdio(config: ClientConfig) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes them."""
    binding = stdio_binding(config)
    server = build_server(lambda _request: binding)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
