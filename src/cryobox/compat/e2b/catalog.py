"""E2B's template catalog under ``/e2b``: reading templates and their builds in the shapes of the pinned SDK's
generated client (``Template``, ``TemplateWithBuilds``, ``TemplateBuild``, ``TemplateBuildLogsResponse``).

- ``GET /templates`` (``teamID``: the caller's workspace id, or left out): the workspace's custom templates and the
  built-ins; ``GET /default-templates``: the built-ins (``isDefault``), ordered by id.
- ``GET /templates/{id}`` (``limit`` 1..100, ``nextToken``): the template with its recipe builds, newest first, a
  page at a time (``X-Next-Token`` when more follow).
- ``GET /templates/{id}/builds/{buildID}/logs``: ``cursor`` (a time in epoch milliseconds, inclusive), ``limit``
  (0..100), ``direction`` (``forward`` from the cursor, oldest first, the default; ``backward`` from it, newest
  first), ``level`` (at least that severe), ``source`` (``persistent`` or ``temporary``: cryobox writes every line
  to the registry as it arrives, so both read the one store).

Every field is a fact cryobox keeps, or the model's documented neutral value where it keeps none (said where set).
Builds whose control plane stopped are settled before anything is read (:mod:`cryobox.server.control.buildwatch`).
Any other query parameter is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response

from ...errors import InvalidArgument, NotFound
from ...registry import TemplateRow
from ...registry.builds import BuildRecord
from ...server.control.templates import RECIPE_KEY
from ...server.routes.buildform import DISK_MIB
from ...server.routes.deps import Caller
from ...util.times import rfc3339
from .paging import page_offset, page_token
from .routing import E2BCtx, E2BRoute
from .tags import split_name
from .templates import LEVELS, log_entry
from .views import ENVD_VERSION, TEMPLATE_ALIASES

router = APIRouter(prefix="/e2b", route_class=E2BRoute, include_in_schema=False)
MAX_PAGE = 100
STATUSES = ("waiting", "building", "ready", "error")


def refuse_query(request: Request, allowed: set[str]) -> None:
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise InvalidArgument(
            f"cryobox does not support the query parameter(s) {', '.join(unknown)}", details={"fields": unknown}
        )


def _build(record: BuildRecord) -> dict[str, Any]:
    """``TemplateBuild``."""
    out: dict[str, Any] = {
        "buildID": record.build_id,
        "status": record.status,
        "createdAt": rfc3339(record.created_at),
        "updatedAt": rfc3339(record.updated_at if record.updated_at is not None else record.created_at),
        "cpuCount": record.cpus,
        "memoryMB": record.memory_mib,
        "diskSizeMB": DISK_MIB,  # every recipe-built template's disk
        "envdVersion": ENVD_VERSION,
    }
    if record.finished_at is not None:
        out["finishedAt"] = rfc3339(record.finished_at)
    return out


def template(row: TemplateRow, builds: Sequence[BuildRecord]) -> dict[str, Any]:
    """``Template`` of ``row`` and its recipe builds (oldest first; none for a built-in or a ``/v1`` build)."""
    ready = [b for b in builds if b.status == "ready"]
    latest = builds[-1] if builds else None
    # the last successful build; a template never built from a recipe names its image generation instead
    build_id = ready[-1].build_id if ready else row.generation or (latest.build_id if latest else "")
    status = latest.status if latest is not None else row.status
    updated = [row.created_at, *(b.updated_at or b.created_at for b in builds)]
    recipe = isinstance((row.spec or {}).get(RECIPE_KEY), dict)
    aliases = [row.name, *sorted(a for a, t in TEMPLATE_ALIASES.items() if t == row.name and a != row.name)]
    return {
        "templateID": row.name,
        "buildID": build_id,
        "cpuCount": row.cpus,
        "memoryMB": row.memory_mib,
        # a recipe-built template's disk is DISK_MIB; of the others cryobox records no size: the neutral 0
        "diskSizeMB": DISK_MIB if recipe else 0,
        "public": row.workspace_id is None,
        "aliases": aliases,
        "names": aliases,
        "createdAt": rfc3339(min([row.created_at, *(b.created_at for b in builds)])),
        "updatedAt": rfc3339(max(updated)),
        "createdBy": None,  # keys belong to workspaces, not users: cryobox knows no creator
        # cryobox keeps no spawn history (a sandbox's row goes with it): never spawned, as far as it can say
        "lastSpawnedAt": None,
        "spawnCount": 0,
        # recipe builds are counted; a built-in (built by its agents) or a /v1 build (no record) counts its one build
        "buildCount": len(builds) or (1 if row.generation else 0),
        "envdVersion": ENVD_VERSION,
        "buildStatus": status if status in STATUSES else "error",
        "isDefault": row.workspace_id is None,
    }


async def _templates(ctx: Caller) -> list[dict[str, Any]]:
    builds = ctx.control.builds
    await builds.settle_workspace(ctx.workspace_id)
    out = []
    for row in sorted(await ctx.control.templates.list(ctx.workspace_id), key=lambda r: r.name):
        history = await builds.builds_of(ctx.workspace_id, row.name) if row.workspace_id is not None else []
        out.append(template(row, history))
    return out


@router.get("/templates")
async def list_templates(
    request: Request, ctx: E2BCtx, team_id: Annotated[str | None, Query(alias="teamID")] = None
) -> list[dict[str, Any]]:
    refuse_query(request, {"teamID"})
    if team_id is not None and team_id != ctx.workspace_id:
        raise InvalidArgument("teamID must be the caller's own workspace id (or left out)", details={"field": "teamID"})
    return await _templates(ctx)


@router.get("/default-templates")
async def default_templates(request: Request, ctx: E2BCtx) -> list[dict[str, Any]]:
    """The built-ins, by id; their usage fields are the neutral ones (see :func:`template`)."""
    refuse_query(request, set())
    rows = await ctx.control.templates.list(ctx.workspace_id)
    return [template(r, []) for r in sorted(rows, key=lambda r: r.name) if r.workspace_id is None]


@router.get("/templates/{template_id}")
async def template_with_builds(
    template_id: str,
    request: Request,
    response: Response,
    ctx: E2BCtx,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> dict[str, Any]:
    """``TemplateWithBuilds``: builds newest first, ``limit`` a page."""
    refuse_query(request, {"limit", "nextToken"})
    name = split_name(template_id)[0]
    start = page_offset(next_token)
    history = await ctx.control.builds.builds_of(ctx.workspace_id, name)  # first: it settles an interrupted build
    row = await ctx.control.templates.visible(name, ctx.workspace_id)
    if row.workspace_id is None:
        history = []
    newest = list(reversed(history))
    if start + limit < len(newest):
        response.headers["X-Next-Token"] = page_token(start + limit)
    return {**template(row, history), "builds": [_build(b) for b in newest[start : start + limit]]}


@router.get("/templates/{template_id}/builds/{build_id}/logs")
async def build_logs(
    template_id: str,
    build_id: str,
    request: Request,
    ctx: E2BCtx,
    cursor: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=MAX_PAGE)] = MAX_PAGE,
    direction: Annotated[Literal["forward", "backward"], Query()] = "forward",
    level: Annotated[str | None, Query()] = None,
    source: Annotated[Literal["persistent", "temporary"] | None, Query()] = None,  # one store: both read it
) -> dict[str, Any]:
    """``TemplateBuildLogsResponse``."""
    refuse_query(request, {"cursor", "limit", "direction", "level", "source"})
    if level is not None and level not in LEVELS:
        raise InvalidArgument(f"level must be one of {', '.join(LEVELS)}", details={"field": "level"})
    record = await ctx.control.builds.build(ctx.workspace_id, build_id)
    if record.template != split_name(template_id)[0]:
        raise NotFound(f"build {build_id} is not a build of {template_id}", details={"build_id": build_id})
    lines = await ctx.control.builds.build_logs_by_time(
        ctx.workspace_id,
        build_id,
        cursor=None if cursor is None else cursor / 1000,
        newest_first=direction == "backward",
        limit=limit,
        min_level=level,
    )
    return {"logs": [log_entry(e) for e in lines]}


__all__ = ["refuse_query", "router", "template"]
