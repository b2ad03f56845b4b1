"""The console's API: ``/ui/api/events`` (SSE), ``/ui/api/metrics/history``, ``/ui/api/sandboxes/{id}/execs``,
and the bisect jobs (``POST /v1/snapshots/{id}/bisect``, ``GET /v1/bisects/{id}``). Authenticated like every
``/v1`` route: an API key, or the console's session cookie (with ``X-CSRF-Token`` on writes)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..server.access import cookies as auth
from ..server.access.gate import bearer_key
from ..server.control.forks import MAX_TREE
from ..server.mapping import sandbox_view, snapshot_view, template_view
from ..server.routes.deps import Caller, Ctx
from ..server.routes.errors import ERROR_RESPONSES
from ..server.routes.fleet import agent_views
from .events import event_stream
from .state import ConsoleState, console_state

router = APIRouter(tags=["console"], responses=ERROR_RESPONSES)
Console = Annotated[ConsoleState, Depends(console_state)]


class BisectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, max_length=1 << 16)
    count: int = Field(default=16, ge=1, le=MAX_TREE)
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)


def _still_allowed(request: Request, caller: Caller) -> Any:
    key = bearer_key(request.headers.get("authorization"))
    token = auth.session_token(request.headers.get("cookie"))

    async def check() -> bool:
        if key is not None:
            return await caller.app.keys.check(key) is not None
        if token is not None:
            return await asyncio.to_thread(caller.app.sessions.authenticate, token) is not None
        return False

    return check


@router.get("/ui/api/events", response_class=StreamingResponse, include_in_schema=False)  # endless: not fuzzable
async def events(request: Request, ctx: Ctx, console: Console) -> StreamingResponse:
    """Live ``sandboxes``, ``metrics``, ``agents``, ``snapshots`` and ``templates`` events for the caller's
    workspace."""

    async def sandboxes() -> list[dict[str, Any]]:
        rows = await ctx.control.list_rows(ctx.workspace_id, None, {})
        return [sandbox_view(r).model_dump(mode="json") for r in rows]

    async def agents() -> list[dict[str, Any]]:
        return await agent_views(ctx.control)

    async def snapshots() -> list[dict[str, Any]]:
        rows = await ctx.control.snapshots.list_rows(ctx.workspace_id, None, {})
        return [snapshot_view(r).model_dump(mode="json") for r in rows]

    async def templates() -> list[dict[str, Any]]:
        jobs = ctx.control.templates
        rows = await jobs.list(ctx.workspace_id)
        return [template_view(r, jobs.progress.get(r.name)).model_dump(mode="json") for r in rows]

    stream = event_stream(
        sandboxes=sandboxes,
        agents=agents,
        snapshots=snapshots,
        templates=templates,
        sampler=console.sampler,
        still_allowed=_still_allowed(request, ctx),
        disconnected=request.is_disconnected,
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


@router.get("/ui/api/metrics/history")
async def metrics_history(ctx: Ctx, console: Console) -> dict[str, Any]:
    """The sampler's ring: one sample every 2 s for the last 10 minutes, oldest first."""
    return {"samples": console.sampler.history()}


@router.get("/ui/api/sandboxes/{sandbox_id}/execs")
async def exec_history(sandbox_id: str, ctx: Ctx) -> dict[str, Any]:
    """The last 50 ``exec`` calls run through this replica's API in the sandbox, oldest first."""
    await ctx.control.row(sandbox_id, ctx.workspace_id)  # 404 for another workspace's sandbox
    return {"execs": [r.to_json() for r in ctx.app.execs.list(sandbox_id)]}


@router.post("/v1/snapshots/{snapshot_id}/bisect", status_code=202)
async def start_bisect(snapshot_id: str, body: BisectRequest, ctx: Ctx, console: Console) -> dict[str, Any]:
    """ext: restore the snapshot, fork it ``count`` times, run ``command`` in every child, count the children
    that reproduce (exit non-zero or time out). Answers at once; poll ``GET /v1/bisects/{id}``."""
    await ctx.control.snapshots.get(snapshot_id, ctx.workspace_id)  # 404 before anything starts
    job = console.bisects.start(ctx.workspace_id, snapshot_id, body.command, body.count, body.timeout_seconds)
    return job.to_json()


@router.get("/v1/bisects/{bisect_id}")
async def get_bisect(bisect_id: str, ctx: Ctx, console: Console) -> dict[str, Any]:
    """ext: a bisect job's state and, once ``done``, its counts (``reproduced``/``passed`` of ``count``)."""
    return console.bisects.get(bisect_id, ctx.workspace_id).to_json()
