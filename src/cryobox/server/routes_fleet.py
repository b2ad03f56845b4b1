"""The fleet: agents' heartbeats (node token) and the list of agents (API key)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from ..agentapi import models as am
from ..errors import InvalidArgument, Unauthorized
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


@router.get("/v1/agents")
async def list_agents(ctx: Ctx) -> dict[str, Any]:
    """ext: the host agents, their state, last heartbeat and capacity."""
    rows = await ctx.control.fleet.agents()
    return {
        "agents": [
            {
                "name": row.name,
                "url": row.url,
                "status": row.status if ctx.control.fleet.is_alive(row) or row.status != "up" else "silent",
                "heartbeat_at": row.heartbeat_at,
                "registered_at": row.registered_at,
                "capacity": row.capacity,
            }
            for row in rows
        ]
    }
