"""Helpers shared by the API commands (``cryobox sandbox``, ``template``, ``snapshot``): options, output, errors."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from ..errors import CryoboxError

if TYPE_CHECKING:  # the SDK (httpx) and the models (pydantic) are imported when a command uses them
    from pydantic import TypeAdapter

    from .. import models
    from ..sdk.sandbox import Sandbox

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

PIPE_WIDTH = 1000
"""Output that is not a terminal (a pipe, a file, a test's runner) is never cut at 80 columns: scripts read it."""


def stdout_console() -> Console:
    """A console for a command's output: the terminal's width on a terminal, :data:`PIPE_WIDTH` otherwise."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


out = stdout_console()
err = Console(stderr=True)

Json = Annotated[bool, typer.Option("--json", help="machine-readable output")]
CacheDir = Annotated[Path | None, typer.Option("--cache-dir", help="image cache (default /var/cache/cryobox)")]
ApiUrl = Annotated[str | None, typer.Option("--api-url", envvar="CRYOBOX_API_URL", help="API base URL")]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="CRYOBOX_API_KEY", help="API key")]


@cache
def _snapshot_adapter() -> TypeAdapter[models.Snapshot]:
    from pydantic import TypeAdapter

    from .. import models

    return TypeAdapter(models.Snapshot)


def fail(error: CryoboxError) -> NoReturn:
    err.print(f"[red]error[/red] ({error.code}): {error.message}")
    raise typer.Exit(2)


@contextmanager
def connected(sandbox_id: str, api_url: str | None, api_key: str | None) -> Iterator[Sandbox]:
    """The sandbox, closed afterwards; an API error on the way exits with its message."""
    from ..sdk.sandbox import Sandbox

    try:
        sbx = Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key)
    except CryoboxError as error:
        fail(error)
    try:
        yield sbx
    except CryoboxError as error:
        fail(error)
    finally:
        sbx.close()


def utc_time(epoch_s: float) -> str:
    """``2024-05-01 12:00:00.250Z``: a time of a log or a sample, to the millisecond."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def parse_pairs(pairs: list[str] | None, what: str = "metadata") -> dict[str, str]:
    """``["K=V", ...]`` as a dict (the last K wins); ``K=`` gives an empty value."""
    result = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must be KEY=VALUE, not {pair!r}")
        result[key] = value
    return result


def format_pairs(pairs: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def sandbox_table(items: list[models.Sandbox]) -> Table:
    table = Table("id", "template", "status", "boot", "created", "metadata")
    for s in items:
        table.add_row(
            s.id, s.template, s.status, f"{s.boot_mode} {s.boot_ms:.0f} ms", s.created_at, format_pairs(s.metadata)
        )
    return table


def snapshot_json(snapshot: models.Snapshot) -> dict[str, Any]:
    """The snapshot as the API sends it (``created_at`` in RFC 3339)."""
    value: dict[str, Any] = _snapshot_adapter().dump_python(snapshot, mode="json")
    return value


def _size(size_bytes: int) -> str:
    value, unit = float(size_bytes), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{size_bytes} B" if unit == "B" else f"{value:.1f} {unit}"


def snapshot_table(items: list[models.Snapshot]) -> Table:
    table = Table("id", "sandbox", "template", "size", "unique", "shared", "created", "retain", "labels")
    for s in items:
        table.add_row(
            s.id,
            s.sandbox_id,
            s.template,
            _size(s.size_bytes),
            _size(s.unique_bytes),
            _size(s.shared_bytes),
            s.created_at.isoformat(timespec="seconds"),
            "yes" if s.retain else "",
            format_pairs(s.labels),
        )
    return table


def parse_duration(text: str) -> float:
    """``"3600"``, ``"90m"``, ``"1h"``, ``"2d"`` -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise typer.BadParameter(f"not a duration: {text!r} (e.g. 3600, 90m, 1h, 2d)")
    return float(match[1]) * _UNITS[match[2]]
