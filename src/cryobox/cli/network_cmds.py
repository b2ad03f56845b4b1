"""``cryobox sandbox network`` (show or replace a sandbox's network policy) and ``cryobox sandbox egress`` (its
egress decision log), through the SDK; the policy options ``sandbox create`` shares."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ._common import ApiKey, ApiUrl, Json, connected, err, out, print_json, utc_time

if TYPE_CHECKING:
    from .. import models


class Default(StrEnum):
    allow = "allow"
    deny = "deny"


DefaultOpt = Annotated[
    Default | None, typer.Option("--default", help="what a connection no rule matches gets (default: deny)")
]
AllowOpt = Annotated[
    list[str] | None,
    typer.Option("--allow", help="IPv4 network, address or host name (*.example.org) to allow (repeatable)"),
]
DenyOpt = Annotated[list[str] | None, typer.Option("--deny", help="same shapes as --allow, to deny (repeatable)")]
PortOpt = Annotated[
    list[int] | None, typer.Option("--port", help="a destination port egress may use (repeatable; none: any)")
]
PublicOpt = Annotated[
    bool | None,
    typer.Option(
        "--public-traffic/--no-public-traffic", help="reach the guest's ports without its traffic token (default: yes)"
    ),
]
MaskOpt = Annotated[
    str | None, typer.Option("--mask-host", help="the Host the port proxy sends to the guest (${PORT}: the port)")
]


def policy_from_options(
    default: Default | None,
    allow: list[str] | None,
    deny: list[str] | None,
    ports: list[int] | None,
    public_traffic: bool | None,
    mask_host: str | None,
) -> dict[str, Any] | None:
    """The policy the options say (fields not given left out: the defaults), or ``None`` when none is given."""
    given = {
        "default": None if default is None else default.value,
        "allow": allow or None,
        "deny": deny or None,
        "ports": ports or None,
        "public_traffic": public_traffic,
        "mask_request_host": mask_host,
    }
    policy = {key: value for key, value in given.items() if value is not None}
    return policy or None


def print_policy(policy: models.NetworkPolicy | None) -> None:
    if policy is None:
        out.print("no network policy reported (the server predates policies)", markup=False, highlight=False)
        return
    rows = [
        ("default", policy.default),
        ("allow", " ".join(policy.allow) or "-"),
        ("deny", " ".join(policy.deny) or "-"),
        ("ports", " ".join(str(p) for p in policy.ports) or "any"),
        ("public traffic", "yes" if policy.public_traffic else "no (the traffic token is needed)"),
        ("mask request host", policy.mask_request_host or "-"),
    ]
    for name, value in rows:
        out.print(f"{name:<18} {value}", markup=False, highlight=False)


def network(
    sandbox_id: str,
    default: DefaultOpt = None,
    allow: AllowOpt = None,
    deny: DenyOpt = None,
    port: PortOpt = None,
    public_traffic: PublicOpt = None,
    mask_host: MaskOpt = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Show a sandbox's network policy; with any policy option, REPLACE the whole policy, live.

    Replacing is not editing: every option not given is reset to its default (deny, no rules, any port).

    `--default deny` alone closes egress. Connections the new policy no longer allows are cut.
    """
    policy = policy_from_options(default, allow, deny, port, public_traffic, mask_host)
    with connected(sandbox_id, api_url, api_key) as sbx:
        current = sbx.get_network() if policy is None else sbx.set_network(policy)
    if policy is not None:
        err.print(f"{sandbox_id}: network policy replaced")
    if as_json:
        print_json(current.model_dump(mode="json"))
    else:
        print_policy(current)


def egress_table(log: models.EgressLog) -> Table:
    """One row per decision, in the log's order (oldest first). Names come from the guest: never markup."""
    table = Table("time", "name", "ip", "port", "verdict", "reason", "out", "in", "error")
    for d in log.items:
        table.add_row(
            utc_time(d.time),
            Text(d.name or "-"),
            Text(d.ip or "-"),
            str(d.port),
            Text("allowed", style="green") if d.allowed else Text("denied", style="red"),
            Text(d.reason),
            str(d.bytes_out),
            str(d.bytes_in),
            Text(d.error or ""),
        )
    return table


def egress(
    sandbox_id: str,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, max=1000, help="newest decisions to show")] = 100,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Show a sandbox's egress decisions (oldest first): each connection or DNS query its network policy
    allowed or denied, the rule that decided, and the bytes it moved."""
    with connected(sandbox_id, api_url, api_key) as sbx:
        log = sbx.egress_log(limit)
    if as_json:
        print_json(log.model_dump(mode="json"))
        return
    if log.items:
        out.print(egress_table(log))
    else:
        err.print(f"{sandbox_id}: no egress decisions recorded")
    if log.dropped:
        err.print(f"{log.dropped} older decisions no longer kept")
