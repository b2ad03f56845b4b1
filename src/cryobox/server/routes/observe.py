"""A sandbox's samples and log (``/v1``); reading them never wakes the sandbox nor counts as activity.

- ``GET /v1/sandboxes/{id}/metrics?start=&end=``: the CPU and memory samples its agent took in ``[start, end]``
  (epoch seconds, either left out), oldest first.
- ``GET /v1/sandboxes/{id}/logs?offset=&limit=&direction=&level=&search=``: a page of its log (guest console lines
  and the agent's lines about it): ``forward`` (default) from ``offset``, oldest first; ``backward`` before
  ``offset`` (default: the newest), newest first; ``level`` keeps that level and the more severe ones, ``search``
  a case-sensitive substring.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ... import models
from ...agentapi.models_obs import MAX_LOG_SEARCH, LogQuery
from ...errors import InvalidArgument
from ...models.observe import MAX_LOG_LIMIT, LogLevel
from ..control.observe import sandbox_logs, sandbox_metrics
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/sandboxes", tags=["observe"], responses=ERROR_RESPONSES)
DEFAULT_LOG_LIMIT = 100


@router.get("/{sandbox_id}/metrics", response_model=models.SandboxMetrics)
async def metrics(
    sandbox_id: str,
    ctx: Ctx,
    start: Annotated[float | None, Query(ge=0)] = None,
    end: Annotated[float | None, Query(ge=0)] = None,
) -> models.SandboxMetrics:
    """The sandbox's samples in ``[start, end]``, oldest first."""
    if start is not None and end is not None and start > end:
        raise InvalidArgument("start is after end", details={"field": "start"})
    series = await sandbox_metrics(ctx.control, sandbox_id, ctx.workspace_id, start, end)
    return models.SandboxMetrics(
        sandbox_id=sandbox_id,
        interval_seconds=series.interval_s,
        samples=[models.MetricSample.model_validate(s.model_dump()) for s in series.samples],
        dropped=series.dropped,
    )


@router.get("/{sandbox_id}/logs", response_model=models.SandboxLogs)
async def logs(
    sandbox_id: str,
    ctx: Ctx,
    offset: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LOG_LIMIT)] = DEFAULT_LOG_LIMIT,
    direction: Literal["forward", "backward"] = "forward",
    level: LogLevel | None = None,
    search: Annotated[str | None, Query(max_length=MAX_LOG_SEARCH)] = None,
) -> models.SandboxLogs:
    """A page of the sandbox's log; ``next_offset`` continues it in the same direction."""
    query = LogQuery(limit=limit, direction=direction, offset=offset, level=level, search=search)
    page = await sandbox_logs(ctx.control, sandbox_id, ctx.workspace_id, query)
    return models.SandboxLogs(
        sandbox_id=sandbox_id,
        logs=[models.SandboxLogEntry.model_validate(e.model_dump()) for e in page.entries],
        next_offset=page.next_offset,
        dropped=page.dropped,
    )
