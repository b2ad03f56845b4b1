"""Templates, platform info and liveness."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Response

from ... import models
from ...errors import CryoboxError, InvalidArgument
from ..buildviews import build_view
from ..mapping import template_view
from .builds import RESERVED
from .deps import Ctx, PublicCtx
from .errors import ERROR_RESPONSES

router = APIRouter(tags=["platform"])


@router.get("/v1/templates", response_model=models.TemplateList, responses=ERROR_RESPONSES)
async def list_templates(ctx: Ctx) -> models.TemplateList:
    jobs = ctx.control.templates
    await ctx.control.builds.settle_workspace(ctx.workspace_id)  # a build whose control plane stopped: failed
    return models.TemplateList(
        items=[template_view(r, jobs.progress.get(r.name)) for r in await jobs.list(ctx.workspace_id)]
    )


@router.get("/v1/templates/{name}", response_model=models.Template, responses=ERROR_RESPONSES)
async def get_template(name: str, ctx: Ctx) -> models.Template:
    """The template; with the id of its latest build from a Dockerfile or an image and where it failed, if so."""
    jobs = ctx.control.templates
    latest = await ctx.control.builds.latest_build(ctx.workspace_id, name)  # first: it settles an interrupted build
    view = template_view(await jobs.visible(name, ctx.workspace_id), jobs.progress.get(name))
    if latest is None:
        return view
    build = build_view(latest)
    return view.model_copy(update={"build_id": build.id, "failed_step": build.failed_step})


@router.post("/v1/templates", status_code=202, response_model=models.Template, responses=ERROR_RESPONSES)
async def create_template(body: models.TemplateCreateRequest, ctx: Ctx) -> models.Template:
    """Start building a custom template (images, then a bake); poll ``GET /v1/templates/{name}``."""
    if body.name in RESERVED:
        raise InvalidArgument(f"template name {body.name!r} is reserved", details={"field": "name"})
    await ctx.control.builds.latest_build(ctx.workspace_id, body.name)  # settles a build whose control plane stopped
    row = await ctx.control.templates.start_build(ctx.workspace_id, body)
    return template_view(row, ctx.control.templates.progress.get(row.name))


@router.delete("/v1/templates/{name}", status_code=204, response_class=Response, responses=ERROR_RESPONSES)
async def delete_template(name: str, ctx: Ctx) -> Response:
    await ctx.control.templates.delete(name, ctx.workspace_id)
    return Response(status_code=204)


@router.get("/v1/info", response_model=models.Info)
async def info(ctx: PublicCtx) -> models.Info:
    agents = await ctx.control.fleet.live_agents()
    caps: list[dict[str, object]] = []
    for row, agent in agents:  # asked now, not the last heartbeat's (up to an interval old)
        try:
            caps.append((await agent.capacity()).model_dump())
        except CryoboxError:
            caps.append(dict(row.capacity))

    def total(key: str) -> int:
        return sum(int(str(c.get(key) or 0)) for c in caps)

    return models.Info(
        version=ctx.version,
        accelerator=_accelerator(
            [row.info.get("accelerator") for row, _ in agents]
            or [row.info.get("accelerator") for row in await ctx.control.fleet.agents()]
        ),
        hosts=[row.name for row, _ in agents],
        isolation={row.name: row.info.get("jail") or {} for row, _ in agents},
        capacity={
            "agents": len(agents),
            "sandboxes": total("sandboxes"),
            "memory_total_mib": total("memory_total_mib"),
            "memory_committed_mib": total("memory_committed_mib"),
            "vcpus_total": total("vcpus_total"),
            "restores_in_flight": total("restores_in_flight"),
            "restores_peak": max([int(str(c.get("restores_peak") or 0)) for c in caps] or [0]),
            "sandboxes_running": total("sandboxes_running"),
            "prespawned_vms": total("prespawned"),
            "max_concurrent_restores": total("max_concurrent_restores"),
            "admission_queue_depth": total("admission_queue_depth"),
        },
        sandbox_domain=ctx.sandbox_domain,
    )


def _accelerator(reported: list[object]) -> Literal["kvm", "tcg"]:
    """What the agents run guests with, as they report it (the live ones; with none live, any registered one): the
    control plane's own host says nothing about theirs. With no agent ever registered: ``tcg``, the weaker claim."""
    for value in reported:
        if value in ("kvm", "tcg"):
            return "kvm" if value == "kvm" else "tcg"
    return "tcg"


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(ctx: PublicCtx) -> Response:
    await ctx.control.refresh_state_counts()
    body, content_type = await ctx.metrics.render_all()
    return Response(content=body, media_type=content_type)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
