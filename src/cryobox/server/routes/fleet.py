"""The fleet: agents' heartbeats (node token), the list of agents and draining one (API key)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from ...agentapi import models as am
from ...errors import InvalidArgument, Unauthorized
from .. import wire
from ..control.hibernations import DrainReport
from ..control.sandboxes import ControlPlane
from .deps import Ctx, PublicCtx
from .errors import ERROR_RESPONSES

router = APIRouter(tags=["fleet"], responses=ERROR_RESPONSES)


def check_node_token(request: Request, expected: str) -> None:
    """Constant-time check of ``Authorization: Bearer <node token>``; nothing runs without it."""
    header = request.headers.get("authorization", "")
    presented = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not expected or not presented or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise Unauthorized("missing or wrong node token")


@router.post("/internal/v1/heartbeat", response_model=am.HeartbeatReply, include_in_schema=False)
async def heartbeat(request: Request, ctx: PublicCtx) -> am.HeartbeatReply:
    """An agent registers (new boot id) or reports in; authenticated by the node token, not an API key."""
    check_node_token(request, ctx.control.fleet.config.node_token)
    try:
        body = am.Heartbeat.model_validate_json(await request.body())
    except ValidationError as err:
        raise InvalidArgument(f"bad heartbeat: {err.error_count()} invalid field(s)") from None
    return await ctx.control.fleet.heartbeat(body)


async def agent_views(control: ControlPlane) -> list[dict[str, Any]]:
    """The objects of ``GET /v1/agents`` (also the console's ``agents`` event)."""
    rows = await control.fleet.agents()
    return [
        {
            "name": row.name,
            "url": row.url,
            "status": row.status if control.fleet.is_alive(row) or row.status != "up" else "silent",
            "heartbeat_at": row.heartbeat_at,
            "registered_at": row.registered_at,
            "capacity": row.capacity,
        }
        for row in rows
    ]


@router.get("/v1/agents")
async def list_agents(ctx: Ctx) -> dict[str, Any]:
    """ext: the host agents, their state, last heartbeat and capacity."""
    return {"agents": await agent_views(ctx.control)}


def drain_response(report: DrainReport) -> wire.DrainResponse:
    return wire.DrainResponse(
        agent=report.agent,
        status=report.status,
        count=len(report.drained),
        drained=[wire.DrainedSandbox(id=d.id, seconds=d.seconds, already=d.already) for d in report.drained],
        skipped=[wire.DrainSkipped(id=i, status=s) for i, s in report.skipped],
        errors=[wire.DrainError(id=e.id, code=e.code, error=e.error) for e in report.errors],
        seconds=report.seconds,
    )


@router.post("/v1/agents/{name}/drain", response_model=wire.DrainResponse)
async def drain_agent(name: str, ctx: Ctx) -> wire.DrainResponse:
    """ext: stop placing on the agent (``draining``), hibernate every sandbox on it and copy the images to the
    object store; each wakes on another agent at its next request. Idempotent: a second call finishes what an
    interrupted one left (``errors`` lists sandboxes it could not move this time)."""
    return drain_response(await ctx.control.hibernations.drain(name))


@router.post("/v1/agents/{name}/undrain", response_model=wire.AgentStatus)
async def undrain_agent(name: str, ctx: Ctx) -> wire.AgentStatus:
    """ext: let placement use a draining agent again."""
    row = await ctx.control.hibernations.undrain(name)
    return wire.AgentStatus(name=row.name, status=row.status)
