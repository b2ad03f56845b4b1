"""The MCP server's full tool set, asserted in one place (the unit tests of the tools and the MCP integration
tests)."""

from __future__ import annotations

TOOLS = {
    "create_sandbox",
    "exec",
    "run_code",
    "read_file",
    "write_file",
    "list_files",
    "snapshot",
    "restore",
    "fork_tree",
    "list_sandboxes",
    "list_snapshots",
    "kill",
}
