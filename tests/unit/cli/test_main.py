"""Starting the ``cryobox`` command stays light (issue 37): importing :mod:`cryobox.cli.main`, building the whole
command tree (typer reads every option declaration) and printing the groups' and some commands' ``--help`` import
none of the servers, the registry, the SDK's HTTP stack or the models; each command imports those when it runs.

Measured in a fresh interpreter (this test process has imported everything already)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "fastapi",
    "uvicorn",
    "starlette",
    "sqlalchemy",
    "alembic",
    "mcp",
    "prometheus_client",
    "httpx",
    "asyncio",
    "cryobox.agent",
    "cryobox.agentapi",
    "cryobox.server",
    "cryobox.compose",
    "cryobox.compat",
    "cryobox.registry",
    "cryobox.mcpserver",
    "cryobox.console",
    "cryobox.objstore",
    "cryobox.capture",
    "cryobox.sdk",
    "cryobox.models",
    "cryobox.cli.serve",
)
"""Packages ``cryobox --help`` (and so every command's start) must not pay for. (pydantic is not one: typer
validates a command's parameters with it.)"""

PROBE = """
import json, sys
import typer.main
from typer.testing import CliRunner
from cryobox.cli.main import app
{extra}
groups, todo = [], [((), typer.main.get_command(app))]
while todo:
    path, command = todo.pop()
    if hasattr(command, "commands"):
        groups.append(list(path))
        todo.extend(((*path, name), sub) for name, sub in command.commands.items())
asked = [*groups, *{commands}]
runner = CliRunner()
failed = {{" ".join(p): r.output for p in asked if (r := runner.invoke(app, [*p, "--help"])).exit_code != 0}}
print(json.dumps({{"groups": len(groups), "failed": failed, "modules": sorted(sys.modules)}}))
"""
COMMANDS = [["serve"], ["control"], ["keys", "create"], ["sandbox", "create"], ["sandbox", "exec"], ["mcp"], ["gc"]]
"""Commands asked for ``--help`` besides every group (each ``--help`` renders the group's command list; a command's
own help renders only its options, which building the tree has read for every command)."""


def _probe(extra: str = "", commands: list[list[str]] | None = None) -> dict[str, object]:
    script = PROBE.format(extra=extra, commands=json.dumps(commands or []))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    probed: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return probed


def _heavy(modules: object) -> list[str]:
    assert isinstance(modules, list)
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_the_command_tree_and_its_help_import_nothing_heavy() -> None:
    probed = _probe(commands=COMMANDS)
    assert probed["failed"] == {}
    assert isinstance(probed["groups"], int) and probed["groups"] >= 10  # the root, sandbox, keys, snapshot, ...
    assert _heavy(probed["modules"]) == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The check can fail: what ``cryobox keys`` loads when it runs (the registry, SQLAlchemy) is reported."""
    loaded = _heavy(_probe("import cryobox.registry")["modules"])
    assert "sqlalchemy" in loaded
    assert "cryobox.registry" in loaded


def test_serve_does_not_import_what_only_snapshots_or_mcp_need() -> None:
    """A restarting ``serve`` waits for its imports (~2.5 s here): numpy (0.13 s) is imported by the first snapshot
    that compares pages, the MCP SDK (0.3 s) by the first request to ``/mcp``, not at the start."""
    names = ("numpy", "mcp", "cryobox.mcpserver.http")
    probe = f"import sys, cryobox.cli.serve; print(*(m in sys.modules for m in {names!r}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["False", "False", "True"]  # the endpoint is there, its SDK is not
