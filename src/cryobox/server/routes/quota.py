"""ext: the caller's workspace quota, read-only (``GET /v1/quota``; set with ``cryobox keys quota``)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from .. import wire
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["platform"], responses=ERROR_RESPONSES)


@router.get("/quota", response_model=wire.QuotaResponse)
async def get_quota(ctx: Ctx) -> wire.QuotaResponse:
    """The workspace's effective limits (its own, else the server's defaults; the paused retention is the
    server's) and what it uses now: sandboxes starting, running or paused with their vCPUs and memory, hibernated
    sandboxes, snapshot bytes and custom templates. A create, fork, tree, wake, hibernation, snapshot or template
    build past a limit gets 429 ``quota_exceeded`` with ``details: {resource, limit, used, requested}`` and
    changes nothing."""
    quota, usage = await ctx.control.quotas.status(ctx.workspace_id)
    limits = {**quota.limits(), "paused_retention_s": ctx.control.timeouts.retention_s}
    return wire.QuotaResponse(
        workspace=ctx.workspace.name,
        workspace_id=ctx.workspace_id,
        limits=wire.QuotaLimits.model_validate(limits),
        usage=wire.QuotaUsage.model_validate(asdict(usage)),
    )
