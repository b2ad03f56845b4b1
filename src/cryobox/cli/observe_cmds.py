"""``cryobox sandbox metrics`` (a sandbox's CPU and memory samples) and ``cryobox sandbox logs`` (its console and
the agent's lines about it), through the SDK. Reading either never wakes the sandbox nor counts as activity."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from ._common import ApiKey, ApiUrl, Json, connected, err, out, print_json, utc_time

if TYPE_CHECKING:
    from .. import models


MIB = 1 << 20
LEVEL_STYLES = {"debug": "dim", "info": "", "warn": "yellow", "error": "red"}


class Level(StrEnum):
    debug = "debug"
    info = "info"
    warn = "warn"
    error = "error"


def _mib(value: int) -> str:
    return f"{value / MIB:.0f}"


def metrics_table(series: models.SandboxMetrics) -> Table:
    table = Table("time", "cpu %", "host MiB", "guest MiB used/total", "cache MiB", "disk MiB used/total")
    for s in series.samples:
        guest = f"{_mib(s.mem_used)}/{_mib(s.mem_total)}" + ("" if s.guest_view else " (host)")
        disk = f"{_mib(s.disk_used)}/{_mib(s.disk_total)}" if s.disk_total else "-"
        table.add_row(utc_time(s.timestamp), f"{s.cpu_pct:.1f}", _mib(s.memory_bytes), guest, _mib(s.mem_cache), disk)
    return table


def metrics(
    sandbox_id: str,
    since: Annotated[
        float | None, typer.Option("--since", min=0, help="only the samples of the last SECONDS (default: all kept)")
    ] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Show a sandbox's samples, oldest first: CPU per vCPU and the memory the host charges it for (measured on
    the host), the guest's own memory and disk use. Paused and hibernated sandboxes are not sampled."""
    with connected(sandbox_id, api_url, api_key) as sbx:
        series = sbx.metrics(start=time.time() - since if since is not None else None)
    if as_json:
        print_json(series.model_dump(mode="json"))
        return
    if series.samples:
        out.print(metrics_table(series))
    else:
        err.print(f"{sandbox_id}: no samples (it is sampled every {series.interval_seconds:g} s while it runs)")


def logs_table(page: models.SandboxLogs) -> Table:
    """One row per entry. Messages come from the guest: never markup."""
    table = Table("offset", "time", "level", "source", "message")
    for e in page.logs:
        table.add_row(
            str(e.offset), utc_time(e.timestamp), Text(e.level, style=LEVEL_STYLES[e.level]), e.source, Text(e.message)
        )
    return table


def logs(
    sandbox_id: str,
    offset: Annotated[
        int | None, typer.Option("--offset", min=0, help="from this entry on (backward: before it)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, max=1000, help="entries to show")] = 100,
    backward: Annotated[bool, typer.Option("--backward", help="newest first")] = False,
    level: Annotated[Level | None, typer.Option("--level", help="this level and the more severe ones")] = None,
    search: Annotated[str | None, typer.Option("--search", help="a case-sensitive substring")] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Show a page of a sandbox's log: its guest console's lines and the agent's lines about it (started, paused,
    hibernated, woken, network policy changed, ...). Continue with --offset NEXT (printed after the page)."""
    with connected(sandbox_id, api_url, api_key) as sbx:
        page = sbx.logs(
            offset=offset,
            limit=limit,
            direction="backward" if backward else "forward",
            level=None if level is None else level.value,
            search=search,
        )
    if as_json:
        print_json(page.model_dump(mode="json"))
        return
    if page.logs:
        out.print(logs_table(page))
    else:
        err.print(f"{sandbox_id}: no log entries")
    err.print(
        f"next: --offset {page.next_offset}"
        + (f" ({page.dropped} older entries no longer kept)" if page.dropped else "")
    )
