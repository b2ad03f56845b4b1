"""``cryobox sandbox lifecycle``: show or change a sandbox's TTL, its timeout action (kill or hibernate) and
whether requests wake it when hibernated; the options ``sandbox create`` shares."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from ._common import ApiKey, ApiUrl, Json, connected, out, print_json

if TYPE_CHECKING:
    from ..sdk._base import Lifecycle


class TimeoutAction(StrEnum):
    kill = "kill"
    hibernate = "hibernate"


OnTimeoutOpt = Annotated[
    TimeoutAction | None,
    typer.Option(
        "--on-timeout",
        help="what the TTL's expiry does: kill (delete it; the default) or hibernate (keep it paused until resumed)",
    ),
]
AutoWakeOpt = Annotated[
    bool | None,
    typer.Option(
        "--auto-wake/--no-auto-wake",
        help="whether any request wakes it when hibernated (default: yes; no: only `resume`/`wake`)",
    ),
]


def lifecycle(
    sandbox_id: str,
    ttl: Annotated[int | None, typer.Option("--ttl", min=1, help="reset the idle TTL to this many seconds")] = None,
    on_timeout: OnTimeoutOpt = None,
    auto_wake: AutoWakeOpt = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Show a sandbox's lifecycle (TTL clock, timeout action, auto-wake, until when a hibernated one is kept);
    with options, change it first."""
    with connected(sandbox_id, api_url, api_key) as sbx:
        if ttl is not None:
            sbx.set_ttl(ttl)
        if on_timeout is not None or auto_wake is not None:
            action = on_timeout.value if on_timeout is not None else sbx.lifecycle().on_timeout
            sbx.set_timeout_action(action, auto_wake=auto_wake)  # type: ignore[arg-type]
        current = sbx.lifecycle()
    if as_json:
        print_json(vars(current))
        return
    _show(current)


def _show(current: Lifecycle) -> None:
    ttl = "none" if current.ttl_seconds is None else f"{current.ttl_seconds} s"
    out.print(f"ttl          {ttl} (idle {current.idle_seconds:.0f} s, expires {current.expires_at or 'never'})")
    out.print(f"on timeout   {current.on_timeout}")
    out.print(f"auto-wake    {'yes' if current.auto_wake else 'no (resume it explicitly)'}")
    if current.hibernated_at is not None:
        out.print(f"hibernated   since {current.hibernated_at}, kept until {current.retained_until}")
