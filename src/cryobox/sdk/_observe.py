"""The IO-free part of a sandbox's samples and log: the requests of ``metrics()`` and ``logs()`` (checked before
anything is sent) and parsing their answers (shared by ``Sandbox`` and ``AsyncSandbox``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from urllib.parse import quote

import httpx

from .. import models
from ..errors import InvalidArgument
from ._base import parse_model
from ._requests import ApiRequest

When = float | datetime
"""A point in time: epoch seconds, or a datetime (a naive one is local time)."""
LEVELS = ("debug", "info", "warn", "error")
MAX_SEARCH = 256


def _path(sandbox_id: str, suffix: str) -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def _seconds(value: When, name: str) -> float:
    seconds = value.timestamp() if isinstance(value, datetime) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidArgument(f"{name} must be a datetime or epoch seconds, got {value!r}")
    return float(seconds)


def metrics_request(sandbox_id: str, *, start: When | None, end: When | None) -> ApiRequest:
    """:raises InvalidArgument: ``start`` or ``end`` is not a time, or ``start`` is after ``end``."""
    params: dict[str, str] = {}
    first = _seconds(start, "start") if start is not None else None
    last = _seconds(end, "end") if end is not None else None
    if first is not None and last is not None and first > last:
        raise InvalidArgument("start is after end")
    if first is not None:
        params["start"] = repr(first)
    if last is not None:
        params["end"] = repr(last)
    return ApiRequest("GET", _path(sandbox_id, "/metrics"), params=params or None)


def logs_request(
    sandbox_id: str,
    *,
    offset: int | None,
    limit: int,
    direction: Literal["forward", "backward"],
    level: str | None,
    search: str | None,
) -> ApiRequest:
    """:raises InvalidArgument: a value out of range (nothing is sent)."""
    if isinstance(limit, bool) or not 0 <= limit <= models.observe.MAX_LOG_LIMIT:
        raise InvalidArgument(f"limit must be 0-{models.observe.MAX_LOG_LIMIT}, got {limit!r}")
    if offset is not None and (isinstance(offset, bool) or offset < 0):
        raise InvalidArgument(f"offset must be a non-negative integer, got {offset!r}")
    if direction not in ("forward", "backward"):
        raise InvalidArgument(f"direction must be forward or backward, got {direction!r}")
    if level is not None and level not in LEVELS:
        raise InvalidArgument(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if search is not None and len(search) > MAX_SEARCH:
        raise InvalidArgument(f"search is at most {MAX_SEARCH} characters")
    params = {"limit": str(limit), "direction": direction}
    for name, value in (("offset", offset), ("level", level), ("search", search)):
        if value is not None:
            params[name] = str(value)
    return ApiRequest("GET", _path(sandbox_id, "/logs"), params=params)


def parse_metrics(response: httpx.Response) -> models.SandboxMetrics:
    return parse_model(models.SandboxMetrics, response)


def parse_logs(response: httpx.Response) -> models.SandboxLogs:
    return parse_model(models.SandboxLogs, response)
