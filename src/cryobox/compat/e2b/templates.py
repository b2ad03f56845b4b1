"""E2B's template API under ``/e2b``: what the pinned ``e2b`` SDK's ``Template.build`` and its tag and alias calls
send, onto :class:`~cryobox.server.control.builds.RecipeBuilds` (``control.builds``).

- ``POST /v3/templates`` reserves a build (202): the template's *name* is its ``templateID``, so
  ``Sandbox.create(name)`` and create by id are the same; ``name:tag`` adds the tag.
- ``GET /templates/{id}/files/{hash}`` (201) answers whether the workspace uploaded ``hash`` (E2B's
  ``filesHash``) and a signed URL (:mod:`.uploads`) the SDK PUTs the gzip'd tar to, with no API key.
- ``POST /v2/templates/{id}/builds/{buildID}`` (202) reads the steps into a recipe (``recipe_from_e2b``), each
  COPY's ``filesHash`` translated to the uploaded blob's SHA-256, and starts the reserved build.
- ``GET /templates/{id}/builds/{buildID}/status``: status and log lines from ``logsOffset`` (at most 100 a page;
  the status is read before the lines, so a finished build's last page is complete and the next one empty).
- ``GET /templates/aliases/{alias}``: 200 for the workspace's own (and built-ins), 403 for another's, 404.
- tags: ``POST``/``DELETE /templates/tags``, ``GET /templates/{id}/tags``.

Every request field is honoured or refused (400, naming it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from ...errors import Forbidden, InvalidArgument, NotFound
from ...image.recipe.e2bsteps import recipe_from_e2b
from ...registry.builds import BuildLogEntry, BuildRecord
from ...server.routes.deps import AppContext, Caller, context
from ...util.httpbody import read_body
from .routing import E2BCtx, E2BRoute
from .tags import split_name
from .uploads import TTL_S, UploadGrant, sign, verify

router = APIRouter(prefix="/e2b", route_class=E2BRoute, include_in_schema=False)
MAX_LOG_PAGE = 100
V3_FIELDS = {"name", "alias", "tags", "cpuCount", "memoryMB"}
"""What ``POST /v3/templates`` honours; ``minFreeDiskMb``, ``teamID`` and anything else are refused."""
LEVELS = ("debug", "info", "warn", "error")


def _body_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body


def _refuse_unknown(body: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidArgument(f"cryobox does not support {', '.join(unknown)}", details={"fields": unknown})


def _int_field(body: Mapping[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{field} must be an integer", details={"field": field})
    return value


def _tags(value: Any, field: str = "tags") -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise InvalidArgument(f"{field} must be a list of non-empty strings", details={"field": field})
    return list(value)


@router.post("/v3/templates", status_code=202)
async def request_build(request: Request, ctx: E2BCtx) -> JSONResponse:
    body = _body_object(await request.json())
    _refuse_unknown(body, V3_FIELDS)
    raw = body.get("name") or body.get("alias")
    if not isinstance(raw, str) or not raw:
        raise InvalidArgument("name is required", details={"field": "name"})
    name, tag = split_name(raw)
    tags = _tags(body.get("tags")) + ([tag] if tag else [])
    record = await ctx.control.builds.reserve_build(
        ctx.workspace_id,
        name=name,
        cpus=_int_field(body, "cpuCount"),
        memory_mib=_int_field(body, "memoryMB"),
        tags=tags,
    )
    content = {
        "templateID": name,
        "buildID": record.build_id,
        "public": False,
        "names": [name],
        "aliases": [name],
        "tags": list(record.tags),
    }
    return JSONResponse(content, status_code=202)


async def _reservation(ctx: Caller, template_id: str, build_id: str) -> BuildRecord:
    record = await ctx.control.builds.build(ctx.workspace_id, build_id)
    if record.template != split_name(template_id)[0]:
        raise NotFound(f"build {build_id} is not a build of {template_id}", details={"build_id": build_id})
    return record


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
async def file_upload_link(template_id: str, files_hash: str, request: Request, ctx: E2BCtx) -> JSONResponse:
    if not files_hash or len(files_hash) > 128:
        raise InvalidArgument("files hash must be 1-128 characters", details={"hash": files_hash[:128]})
    name = split_name(template_id)[0]
    present = await ctx.control.builds.file_blob(ctx.workspace_id, files_hash) is not None
    grant = UploadGrant(ctx.workspace_id, name, files_hash, ctx.control.builds.clock() + TTL_S)
    token = sign(ctx.control.registry.sealer, grant)
    url = str(request.url_for("upload_files", token=token))
    return JSONResponse({"present": present, "url": url}, status_code=201)


@router.put("/template-uploads/{token}", name="upload_files")
async def upload_files(token: str, request: Request, app: Annotated[AppContext, Depends(context)]) -> JSONResponse:
    """The signed URL's PUT: no API key, the token is checked before the body is read."""
    builds = app.control.builds
    grant = verify(app.control.registry.sealer, token, builds.clock())
    data = await read_body(request, builds.max_context_bytes)
    app.limiter.check(grant.workspace_id)
    blob = await builds.put_context(grant.workspace_id, data)
    await builds.record_file(grant.workspace_id, grant.files_hash, blob, grant.template)
    return JSONResponse({}, status_code=200)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(template_id: str, build_id: str, request: Request, ctx: E2BCtx) -> Response:
    body = _body_object(await request.json())
    reserved = await _reservation(ctx, template_id, build_id)
    recipe = recipe_from_e2b(body)
    steps = []
    for step in recipe.steps:
        if step.context:
            blob = await ctx.control.builds.file_blob(ctx.workspace_id, step.context)
            if blob is None:
                raise InvalidArgument(
                    f"files {step.context} of step {step.line} were never uploaded", details={"filesHash": step.context}
                )
            step = dataclasses.replace(step, context=blob)
        steps.append(step)
    await ctx.control.builds.start_recipe_build(
        ctx.workspace_id,
        name=reserved.template,
        recipe=dataclasses.replace(recipe, steps=tuple(steps)),
        cpus=reserved.cpus,
        memory_mib=reserved.memory_mib,
        tags=reserved.tags,
        build_id=build_id,
    )
    return Response(status_code=202)


def _rfc3339(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat().replace("+00:00", "Z")


def log_entry(entry: BuildLogEntry) -> dict[str, Any]:
    level = entry.level if entry.level in LEVELS else "info"
    out: dict[str, Any] = {"timestamp": _rfc3339(entry.timestamp), "level": level, "message": entry.message}
    if entry.step:
        out["step"] = entry.step
    return out


@router.get("/templates/{template_id}/builds/{build_id}/status")
async def build_status(
    template_id: str,
    build_id: str,
    ctx: E2BCtx,
    logs_offset: Annotated[int, Query(alias="logsOffset", ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=MAX_LOG_PAGE)] = MAX_LOG_PAGE,
    level: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    if level is not None and level not in LEVELS:
        raise InvalidArgument(f"level must be one of {', '.join(LEVELS)}", details={"field": "level"})
    record = await _reservation(ctx, template_id, build_id)  # read before the lines: see the module's docstring
    lines = await ctx.control.builds.build_logs(ctx.workspace_id, build_id, logs_offset, limit, level)
    out: dict[str, Any] = {
        "templateID": record.template,
        "buildID": record.build_id,
        "status": record.status,
        "logEntries": [log_entry(e) for e in lines],
        "logs": [],
    }
    if record.status == "error":
        reason: dict[str, Any] = {"message": record.error or "build failed", "logEntries": []}
        if record.error_step:
            reason["step"] = record.error_step
        out["reason"] = reason
    return out


@router.get("/templates/aliases/{alias}")
async def alias(alias: str, ctx: E2BCtx) -> dict[str, Any]:
    name = split_name(alias)[0]
    try:
        row = await asyncio.to_thread(ctx.control.registry.get_template, name)
    except NotFound:
        raise NotFound(f"template alias {alias!r} not found", details={"alias": alias}) from None
    if row.workspace_id not in (None, ctx.workspace_id):  # the SDK reads 403 as "exists, not yours"
        raise Forbidden(f"template alias {alias!r} belongs to another team", details={"alias": alias})
    return {"templateID": row.name, "public": row.workspace_id is None}


@router.post("/templates/tags", status_code=201)
async def assign_tags(request: Request, ctx: E2BCtx) -> dict[str, Any]:
    body = _body_object(await request.json())
    _refuse_unknown(body, {"target", "tags"})
    target = body.get("target")
    if not isinstance(target, str) or not target:
        raise InvalidArgument("target is required (name:tag)", details={"field": "target"})
    name, source = split_name(target)
    tags = _tags(body.get("tags"))
    record = await ctx.control.builds.assign_tags(ctx.workspace_id, name, source or "default", tags)
    return {"buildID": record.build_id, "tags": tags}


@router.delete("/templates/tags", status_code=204)
async def remove_tags(request: Request, ctx: E2BCtx) -> Response:
    body = _body_object(await request.json())
    _refuse_unknown(body, {"name", "tags"})
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("name is required", details={"field": "name"})
    await ctx.control.builds.remove_tags(ctx.workspace_id, split_name(name)[0], _tags(body.get("tags")))
    return Response(status_code=204)


@router.get("/templates/{template_id}/tags")
async def template_tags(template_id: str, ctx: E2BCtx) -> list[dict[str, Any]]:
    name = split_name(template_id)[0]
    await ctx.control.templates.visible(name, ctx.workspace_id)
    out = []
    for build in await ctx.control.builds.builds_of(ctx.workspace_id, name):
        for tag in build.tags:
            out.append({"tag": tag, "buildID": build.build_id, "createdAt": _rfc3339(build.created_at)})
    return out


__all__ = ["LEVELS", "log_entry", "router"]
