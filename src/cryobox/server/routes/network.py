"""A sandbox's network policy and its egress decisions (``/v1``).

- ``PUT /v1/sandboxes/{id}/network``: the whole new policy (a field left out takes its default: ``{}`` allows
  nothing); applied to the running sandbox at once, or at the wake of a hibernated one; never wakes it. Answers
  the ``Sandbox`` view with the policy in force.
- ``GET /v1/sandboxes/{id}/network``: the policy in force (the closed policy when the sandbox has none).
- ``GET /v1/sandboxes/{id}/egress?limit=N``: the newest egress decisions (0-1000, default 100), oldest first.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query

from ... import models
from ..control.network import DEFAULT_EGRESS_LIMIT, MAX_EGRESS_LIMIT
from ..mapping import sandbox_view
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/sandboxes", tags=["network"], responses=ERROR_RESPONSES)


@router.put("/{sandbox_id}/network", response_model=models.Sandbox)
async def put_network(
    sandbox_id: str, policy: Annotated[models.NetworkPolicy, Body(default_factory=models.NetworkPolicy)], ctx: Ctx
) -> models.Sandbox:
    """Replace the sandbox's network policy (the whole of it); 400 names a bad field, nothing changed."""
    return sandbox_view(await ctx.control.set_network(sandbox_id, ctx.workspace_id, policy))


@router.get("/{sandbox_id}/network", response_model=models.NetworkPolicy)
async def get_network(sandbox_id: str, ctx: Ctx) -> models.NetworkPolicy:
    return await ctx.control.network.policy(sandbox_id, ctx.workspace_id)


@router.get("/{sandbox_id}/egress", response_model=models.EgressLog)
async def egress_log(
    sandbox_id: str,
    ctx: Ctx,
    limit: Annotated[int, Query(ge=0, le=MAX_EGRESS_LIMIT)] = DEFAULT_EGRESS_LIMIT,
) -> models.EgressLog:
    """The newest egress decisions of the sandbox's proxy and name server, oldest first; ``dropped`` counts
    older ones no longer kept."""
    log = await ctx.control.egress_log(sandbox_id, ctx.workspace_id, limit)
    return models.EgressLog.model_validate(log.model_dump())
