"""PandaStack's template build routes, as its SDK (0.10.0) reads them, over the same builds as cryobox's own.

``POST /v1/templates/build`` is one route for both SDKs (:mod:`cryobox.server.routes.builds`): PandaStack's
``build_from_dockerfile`` sends a multipart form with a part per context file, ``register`` a urlencoded form with
``image_ref``; both get the build (``{id, name, status, error, …}``, status ``queued|building|done|failed``). The
routes here are PandaStack's views of a build by id alone:

- ``GET /v1/templates/builds`` → ``{"items": [build…]}`` (the workspace's, newest first);
- ``GET /v1/templates/builds/{id}`` → the build (what ``wait_for_build`` polls);
- ``GET /v1/templates/builds/{id}/logs[?follow=1]`` → SSE in PandaStack's framing: each log line's text as a
  ``data:`` line (its SDK yields them as they are), then ``data: end``; without ``follow`` only the lines so far.

These paths sit under ``/v1/templates/`` beside ``/v1/templates/{name}``: the router is included before cryobox's
template routes, and ``builds``/``build`` are reserved template names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from ... import models
from ...errors import CryoboxError
from ...registry.builds import BuildRecord
from ...server.buildviews import build_view, follow
from ...server.routes.deps import Ctx
from ...server.routes.errors import ERROR_RESPONSES
from ...server.routes.procs import SSE_DOC as SSE

router = APIRouter(tags=["templates"])
MAX_LIST = 100


def _data(text: str) -> bytes:
    return "".join(f"data: {part}\n" for part in (text.splitlines() or [""])).encode() + b"\n"


@router.get("/v1/templates/builds", response_model=models.TemplateBuildList, responses=ERROR_RESPONSES)
async def list_builds(ctx: Ctx) -> models.TemplateBuildList:
    records = await ctx.control.builds.recent_builds(ctx.workspace_id, MAX_LIST)
    return models.TemplateBuildList(items=[build_view(r) for r in records])


@router.get("/v1/templates/builds/{build_id}", response_model=models.TemplateBuild, responses=ERROR_RESPONSES)
async def get_build(build_id: str, ctx: Ctx) -> models.TemplateBuild:
    return build_view(await ctx.control.builds.build(ctx.workspace_id, build_id))


@router.get(
    "/v1/templates/builds/{build_id}/logs", response_class=StreamingResponse, responses={**ERROR_RESPONSES, **SSE}
)
async def build_logs(
    build_id: str, ctx: Ctx, follow_: Annotated[str | None, Query(alias="follow")] = None
) -> StreamingResponse:
    """PandaStack's log stream: ``data: <line>`` per log line, ``data: end`` last."""
    builds = ctx.control.builds
    await builds.build(ctx.workspace_id, build_id)  # a plain 404, not a stream
    live = (follow_ or "").strip().lower() in ("1", "true", "yes")

    async def events() -> AsyncIterator[bytes]:
        try:
            if live:
                async for item in follow(builds, ctx.workspace_id, build_id):
                    if item is None:
                        yield b": keepalive\n\n"
                    elif not isinstance(item, BuildRecord):
                        yield _data(item.message)
            else:
                offset = 0
                while page := await builds.build_logs(ctx.workspace_id, build_id, offset, 500):
                    for entry in page:
                        yield _data(entry.message)
                    offset = page[-1].offset + 1
        except CryoboxError as err:
            yield _data(f"error: {err.message}")
        yield b"data: end\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


__all__ = ["router"]
