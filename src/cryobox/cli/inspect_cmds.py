"""``cryobox inspect net <sandbox>``: the guest's view of the network and time, to diff across a restore."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from ..errors import CryoboxError
from ._common import ApiKey, ApiUrl, Json, fail, out, print_json

inspect_app = typer.Typer(help="Look inside a sandbox.", no_args_is_help=True)


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


def render(view: dict[str, Any]) -> list[Table | str]:
    """Rich renderables for an ``inspect_net`` reply (clock first: it is what a restore most often gets wrong)."""
    clock = view.get("clock") or {}
    parts: list[Table | str] = [
        f"instance id: {view.get('instance_id')}",
        f"wall clock: {clock.get('realtime_ns', 0) / 1e9:.6f}  monotonic: {clock.get('monotonic_ns', 0) / 1e9:.6f}"
        f"  boottime: {clock.get('boottime_ns', 0) / 1e9:.6f}",
    ]
    parts.append(
        _table(
            "interfaces",
            ["name", "mac", "addresses"],
            [[i["name"], str(i.get("mac")), ", ".join(i.get("addresses") or [])] for i in view.get("interfaces", [])],
        )
    )
    parts.append(
        _table(
            "sockets",
            ["proto", "local", "remote", "state"],
            [[s["proto"], s["local"], s["remote"], s["state"]] for s in view.get("sockets", [])],
        )
    )
    parts.append(
        _table(
            "neighbours",
            ["ip", "mac", "device", "flags"],
            [[n["ip"], n["mac"], n["device"], str(n["flags"])] for n in view.get("neighbours", [])],
        )
    )
    parts.append("resolv.conf:\n" + str(view.get("resolv_conf") or "(none)"))
    return parts


@inspect_app.command("net")
def net(sandbox_id: str, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Print the guest's sockets, neighbour table, resolver config, interfaces, wall and monotonic clock.

    Run it before a snapshot and after a restore (``--json`` both times) and diff the two.
    """
    from ..sdk.sandbox import Sandbox

    try:
        sbx = Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key)  # not `with`: that would kill it
        try:
            view = sbx.inspect_net()
        finally:
            sbx.close()
    except CryoboxError as error:
        fail(error)
    if as_json:
        print_json(view)
        return
    for part in render(view):
        out.print(part)
