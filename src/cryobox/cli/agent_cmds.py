"""``cryobox agent``: run a host agent (no subcommand, see :func:`.fleet_cmds.agent`), or act on one through the
control plane's API (``drain``, ``undrain``; ``CRYOBOX_API_URL``/``CRYOBOX_API_KEY`` like the other client
commands)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table

from ..errors import CryoboxError
from ._common import ApiKey, ApiUrl, Json, err, fail, out, print_json
from .fleet_cmds import agent

DRAIN_TIMEOUT_S = 3600.0
"""A drain hibernates every sandbox of the agent and uploads each image: minutes, not seconds."""

agent_app = typer.Typer(help="Run a host agent, or drain one.", invoke_without_command=True)
agent_app.callback()(agent)

AgentName = Annotated[str, typer.Argument(help="the agent's name (see GET /v1/agents)")]


def _post(path: str, api_url: str | None, api_key: str | None) -> dict[str, Any]:
    import httpx

    from ..sdk._transport import ClientConfig, raise_for_error

    config = ClientConfig.resolve(api_url, api_key, timeout_s=DRAIN_TIMEOUT_S)
    try:
        with config.client() as http:
            response = http.post(path)
            raise_for_error(response)
    except CryoboxError as error:
        fail(error)
    except httpx.HTTPError as error:
        err.print(f"[red]error[/red]: {error}")
        raise typer.Exit(2) from error
    body: dict[str, Any] = response.json()
    return body


@agent_app.command("drain")
def drain(name: AgentName, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Stop placing on the agent, hibernate its sandboxes and copy them to the object store; each wakes on
    another agent at its next request. Run it again to finish an interrupted drain (exit 1 while some failed)."""
    with err.status(f"draining agent {name}"):
        report = _post(f"/v1/agents/{quote(name, safe='')}/drain", api_url, api_key)
    if as_json:
        print_json(report)
    else:
        table = Table("sandbox", "seconds", "")
        for item in report["drained"]:
            table.add_row(item["id"], f"{item['seconds']:.1f}", "already stored" if item["already"] else "")
        out.print(table)
        for item in report["skipped"]:
            err.print(f"skipped {item['id']} ({item['status']})")
        for item in report["errors"]:
            err.print(f"[red]{item['id']} not drained[/red] ({item['code']}): {item['error']}")
        err.print(f"agent {name} {report['status']}: {report['count']} sandbox(es) stored in {report['seconds']:.1f}s")
    if report["errors"]:
        raise typer.Exit(1)


@agent_app.command("undrain")
def undrain(name: AgentName, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Let placement use a draining agent again."""
    result = _post(f"/v1/agents/{quote(name, safe='')}/undrain", api_url, api_key)
    if as_json:
        print_json(result)
    else:
        err.print(f"agent {result['name']} is {result['status']}")
