"""Template builds from a Dockerfile or an image reference (``POST /v1/templates/build``, :mod:`.buildform`) and
their status and logs, onto ``control.builds`` (:class:`~cryobox.server.control.builds.RecipeBuilds`).

The POST answers 202 with the build at once (the build goes on in the background); the build is followed by
``GET /v1/templates/{name}/builds/{id}`` (status, failing step), its logs page by page (``…/logs?offset=``) or live
(``…/logs/stream``: SSE, a ``log`` event per line, then exactly one ``done`` or ``error`` event with the build).
PandaStack's routes for the same builds (``/v1/templates/builds…``) are in :mod:`cryobox.compat.pandastack.templates`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ... import models
from ...errors import CryoboxError, InvalidArgument, NotFound
from ...registry.builds import BuildRecord
from ..buildviews import STATUS, build_view, follow, log_line
from .buildform import read_build
from .deps import Caller, Ctx
from .errors import ERROR_RESPONSES
from .procs import SSE_DOC as SSE

router = APIRouter(tags=["templates"])
RESERVED = frozenset({"builds", "build"})
"""Names a template cannot have: ``/v1/templates/builds…`` are PandaStack's build routes."""
MAX_PAGE = 1000
OWN_BODY_LIMITS = frozenset({("POST", "/v1/templates/build")})
"""Routes that cap their bodies themselves (:mod:`.buildform`: an image archive streams to disk, past the API's
usual body cap), exempt from :class:`~cryobox.server.access.limits.BodyLimitMiddleware`."""

_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "dockerfile": {"type": "string", "description": "the Dockerfile's text"},
                        "image": {
                            "type": "string",
                            "description": "an OCI image reference instead of a Dockerfile; with image_archive, "
                            "which image of the archive (a tag)",
                        },
                        "image_archive": {
                            "type": "string",
                            "format": "binary",
                            "description": "an image archive as the base: a docker save tar or a tar of an OCI "
                            "image layout; alone, or with a Dockerfile that starts FROM archive",
                        },
                        "image_ref": {"type": "string", "description": "PandaStack's name for image"},
                        "context": {
                            "type": "string",
                            "format": "binary",
                            "description": "the build context as a tar (plain or gzip, Content-Type "
                            "application/x-tar or application/gzip); or one part per file named by its relative path",
                        },
                        "build_args": {"type": "string", "description": "a JSON object of strings"},
                        "no_cache": {"type": "boolean"},
                        "cpu": {"type": "integer", "minimum": 1, "maximum": 8},
                        "memory_mb": {"type": "integer", "minimum": 256, "maximum": 16384},
                        "size_mb": {"type": "integer", "minimum": 1, "maximum": 8192},
                    },
                }
            },
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "dockerfile": {"type": "string"},
                        "image": {"type": "string"},
                        "image_ref": {"type": "string"},
                        "build_args": {"type": "object", "additionalProperties": {"type": "string"}},
                        "no_cache": {"type": "boolean"},
                        "cpu": {"type": "integer"},
                        "memory_mb": {"type": "integer"},
                        "size_mb": {"type": "integer"},
                    },
                }
            },
        },
    }
}


def sse(event: str, data: object, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _reserved(name: str) -> None:
    if name in RESERVED:
        raise InvalidArgument(f"template name {name!r} is reserved", details={"field": "name", "template": name})


@router.post(
    "/v1/templates/build",
    status_code=202,
    response_model=models.TemplateBuild,
    responses=ERROR_RESPONSES,
    openapi_extra=_BODY,
)
async def build_template(request: Request, ctx: Ctx) -> models.TemplateBuild:
    """Build a template from a Dockerfile (+ context), an image reference or an uploaded image archive
    (``image_archive``: ``docker save`` or an OCI layout tar); 202 with the build, which goes on in the background.
    400 names the field or the Dockerfile line; 413 past a size limit, with nothing stored."""
    builds = ctx.control.builds
    order = await read_build(
        request, max_context_bytes=builds.max_context_bytes, max_archive_bytes=builds.max_archive_bytes
    )
    try:
        _reserved(order.name)
        builds.check_order(order.name, order.cpu, order.memory_mb)
        if order.archive is not None:
            await builds.put_archive(ctx.workspace_id, order.archive.path, order.archive.sha256)
        for blob in order.blobs.values():
            await builds.put_context(ctx.workspace_id, blob)
        record = await builds.start_recipe_build(
            ctx.workspace_id, name=order.name, recipe=order.recipe, cpus=order.cpu, memory_mib=order.memory_mb
        )
    finally:
        order.discard()
    return build_view(record)


async def _build_of(ctx: Caller, name: str, build_id: str) -> BuildRecord:
    record = await ctx.control.builds.build(ctx.workspace_id, build_id)
    if record.template != name:
        raise NotFound(f"build {build_id!r} is not a build of {name!r}", details={"build_id": build_id})
    return record


@router.get("/v1/templates/{name}/builds/{build_id}", response_model=models.TemplateBuild, responses=ERROR_RESPONSES)
async def get_build(name: str, build_id: str, ctx: Ctx) -> models.TemplateBuild:
    return build_view(await _build_of(ctx, name, build_id))


@router.get(
    "/v1/templates/{name}/builds/{build_id}/logs", response_model=models.BuildLogPage, responses=ERROR_RESPONSES
)
async def build_logs(
    name: str,
    build_id: str,
    ctx: Ctx,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    level: Annotated[models.BuildLevel | None, Query()] = None,
) -> models.BuildLogPage:
    record = await _build_of(ctx, name, build_id)  # the status before the lines: a finished build's page is whole
    lines = await ctx.control.builds.build_logs(ctx.workspace_id, build_id, offset, limit, level)
    return models.BuildLogPage(
        build_id=build_id,
        status=STATUS.get(record.status, "building"),
        logs=[log_line(e) for e in lines],
        next_offset=lines[-1].offset + 1 if lines else offset,
    )


@router.get(
    "/v1/templates/{name}/builds/{build_id}/logs/stream",
    response_class=StreamingResponse,
    responses={**ERROR_RESPONSES, **SSE},
)
async def stream_build_logs(
    name: str, build_id: str, request: Request, ctx: Ctx, offset: Annotated[int, Query(ge=0)] = 0
) -> StreamingResponse:
    """SSE: ``log`` ``{offset, timestamp, level, step, message}`` (the SSE id is the offset, so ``Last-Event-ID``
    resumes), then one ``done`` (the build) or ``error`` (``{error, code, build}``) event."""
    await _build_of(ctx, name, build_id)  # a plain 404, not a stream
    resume = request.headers.get("last-event-id", "")
    start = int(resume) + 1 if resume.isdigit() else offset

    async def events() -> AsyncIterator[bytes]:
        try:
            async for item in follow(ctx.control.builds, ctx.workspace_id, build_id, start):
                if item is None:
                    yield b": keepalive\n\n"
                elif isinstance(item, BuildRecord):
                    view = build_view(item).model_dump(mode="json")
                    if item.status == "ready":
                        yield sse("done", view)
                    else:
                        yield sse(
                            "error", {"error": item.error or "build failed", "code": "build_failed", "build": view}
                        )
                else:
                    yield sse("log", log_line(item).model_dump(mode="json"), item.offset)
        except CryoboxError as err:
            yield sse("error", {"error": err.message, "code": err.code})

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


__all__ = ["OWN_BODY_LIMITS", "RESERVED", "router", "sse"]
