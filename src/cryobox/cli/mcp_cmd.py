"""``cryobox mcp``: an MCP server on stdio for agents (see :mod:`cryobox.mcpserver`), a pure client of the API at
``$CRYOBOX_API_URL`` with ``$CRYOBOX_API_KEY`` (as the SDK reads them). stdout carries the protocol: nothing
else may be printed there."""

from __future__ import annotations

import sys


def mcp() -> None:
    """Serve the cryobox tools over MCP on stdio (API from $CRYOBOX_API_URL, key from $CRYOBOX_API_KEY)."""
    import asyncio

    from ..mcpserver.stdio import serve_stdio
    from ..sdk import ClientConfig

    config = ClientConfig.resolve()
    if not config.api_key:
        print("cryobox mcp: CRYOBOX_API_KEY is not set; every tool call will be refused", file=sys.stderr)
    asyncio.run(serve_stdio(config))
