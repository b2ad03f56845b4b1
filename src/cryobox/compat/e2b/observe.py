"""E2B's sandbox metrics and logs (``/e2b``), from what each sandbox's agent keeps (:mod:`cryobox.agent.observe`,
read through :mod:`cryobox.server.control.observe`): never waking a sandbox, never counting as activity.

- ``GET /sandboxes/{id}/metrics?start=&end=`` (``get_metrics``): the samples in ``[start, end]`` (Unix seconds),
  oldest first, as ``SandboxMetric`` s. ``cpuUsedPct`` is measured on the host; memory and disk are the guest's
  own view (when the guest did not answer, the VM's RAM and the host's figure).
- ``GET /sandboxes/metrics?sandbox_ids=a,b`` (at most 100): the newest sample of each of them that has one.
- ``GET /v2/sandboxes/{id}/logs?cursor=&limit=&direction=&level=&search=``: ``SandboxLogEntry`` s, ``forward``
  (oldest first) from ``cursor`` (Unix milliseconds) or ``backward`` (newest first) up to it; ``fields.source``
  is ``console`` (the guest's serial console) or ``agent`` (the host agent's lines about the sandbox).
- ``GET /sandboxes/{id}/logs?start=&limit=`` (deprecated in E2B): the same, forward from ``start``, in both shapes.

Registered before :mod:`.api`'s routes (whose ``GET /sandboxes/{id}`` would take ``/sandboxes/metrics``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from ...agentapi.models_obs import MAX_LOG_PAGE, MAX_LOG_SEARCH, LogEntry, LogQuery, MetricSample
from ...errors import InvalidArgument, NotFound
from ...server.control.observe import sandbox_logs, sandbox_metrics
from ...util.times import rfc3339
from .routing import E2BCtx, E2BRoute

router = APIRouter(prefix="/e2b", route_class=E2BRoute, include_in_schema=False)
MAX_SANDBOX_IDS = 100
Level = Literal["debug", "info", "warn", "error"]


def metric(sample: MetricSample) -> dict[str, Any]:
    """An agent's sample as E2B's ``SandboxMetric``."""
    return {
        "timestamp": rfc3339(sample.timestamp),
        "timestampUnix": int(sample.timestamp),
        "cpuCount": sample.cpu_count,
        "cpuUsedPct": sample.cpu_pct,
        "memUsed": sample.mem_used,
        "memTotal": sample.mem_total,
        "memCache": sample.mem_cache,
        "diskUsed": sample.disk_used,
        "diskTotal": sample.disk_total,
    }


def log_entry(entry: LogEntry) -> dict[str, Any]:
    """An agent's log entry as E2B's ``SandboxLogEntry``."""
    fields = {"source": entry.source, "offset": str(entry.offset)}
    return {"timestamp": rfc3339(entry.timestamp), "level": entry.level, "message": entry.message, "fields": fields}


@router.get("/sandboxes/metrics")
async def list_metrics(request: Request, ctx: E2BCtx) -> dict[str, Any]:
    ids: list[str] = []
    for value in request.query_params.getlist("sandbox_ids"):
        ids += [i.strip() for i in value.split(",") if i.strip() and i.strip() not in ids]
    if not ids:
        raise InvalidArgument("sandbox_ids is required (comma-separated sandbox IDs)", details={"field": "sandbox_ids"})
    if len(ids) > MAX_SANDBOX_IDS:
        raise InvalidArgument(f"at most {MAX_SANDBOX_IDS} sandbox_ids", details={"field": "sandbox_ids"})

    async def newest(sandbox_id: str) -> MetricSample | None:
        try:
            samples = (await sandbox_metrics(ctx.control, sandbox_id, ctx.workspace_id)).samples
        except NotFound:
            return None
        return samples[-1] if samples else None

    found = await asyncio.gather(*(newest(i) for i in ids))
    return {"sandboxes": {i: metric(s) for i, s in zip(ids, found, strict=True) if s is not None}}


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(
    sandbox_id: str,
    ctx: E2BCtx,
    start: Annotated[int | None, Query(ge=0)] = None,
    end: Annotated[int | None, Query(ge=0)] = None,
) -> list[dict[str, Any]]:
    """The samples of ``[start, end]`` (whole seconds: ``end`` takes in the samples of its second)."""
    if start is not None and end is not None and start > end:
        raise InvalidArgument("start is after end", details={"field": "start"})
    upto = end + 0.999999 if end is not None else None
    series = await sandbox_metrics(ctx.control, sandbox_id, ctx.workspace_id, start, upto)
    return [metric(s) for s in series.samples]


@router.get("/v2/sandboxes/{sandbox_id}/logs")
async def logs_v2(
    sandbox_id: str,
    ctx: E2BCtx,
    cursor: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LOG_PAGE)] = MAX_LOG_PAGE,
    direction: Literal["forward", "backward"] = "forward",
    level: Level | None = None,
    search: Annotated[str | None, Query(max_length=MAX_LOG_SEARCH)] = None,
) -> dict[str, Any]:
    forward = direction == "forward"
    query = LogQuery(
        limit=limit,
        direction=direction,
        start_ms=cursor if forward else None,
        end_ms=None if forward else cursor,
        level=level,
        search=search,
    )
    page = await sandbox_logs(ctx.control, sandbox_id, ctx.workspace_id, query)
    return {"logs": [log_entry(e) for e in page.entries]}


@router.get("/sandboxes/{sandbox_id}/logs")
async def logs_v1(
    sandbox_id: str,
    ctx: E2BCtx,
    start: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0)] = MAX_LOG_PAGE,
) -> dict[str, Any]:
    query = LogQuery(limit=min(limit, MAX_LOG_PAGE), start_ms=start)
    page = await sandbox_logs(ctx.control, sandbox_id, ctx.workspace_id, query)
    return {
        "logs": [{"timestamp": rfc3339(e.timestamp), "line": e.message} for e in page.entries],
        "logEntries": [log_entry(e) for e in page.entries],
    }
