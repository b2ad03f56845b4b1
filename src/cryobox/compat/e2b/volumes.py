"""E2B's volumes API (``/e2b/volumes``), as the ``e2b`` 2.63 SDK's ``Volume`` calls it: create (201
``VolumeAndToken``), list (``[Volume]``), get by id (``VolumeAndToken``: how ``Volume.connect`` gets its token),
destroy (204; 404 is ``False`` to the SDK). A volume here is a cryobox volume (:mod:`cryobox.server.control.volumes`)
of ``CRYOBOX_E2B_VOLUME_MB`` (default 1 GiB; E2B's API has no size); its ``token`` is an HMAC of
its id under the registry's key, the bearer token of that volume's content API and of no other volume.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from ...errors import InvalidArgument
from ...registry.volumes import VolumeRow
from ...server.routes.deps import Caller
from .routing import E2BCtx, E2BRoute

router = APIRouter(prefix="/e2b", route_class=E2BRoute, include_in_schema=False)
TOKEN_PURPOSE = "e2b-volume-token"
SIZE_ENV = "CRYOBOX_E2B_VOLUME_MB"
DEFAULT_SIZE_MB = 1024


class NewVolume(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)


def volume_size_bytes() -> int:
    raw = os.environ.get(SIZE_ENV, "").strip()
    try:
        size_mb = int(raw) if raw else DEFAULT_SIZE_MB
    except ValueError:
        raise InvalidArgument(f"{SIZE_ENV} must be a number of MiB, not {raw!r}") from None
    return size_mb << 20


def volume_token(ctx: Caller, volume_id: str) -> str:
    return ctx.control.registry.sealer.mac(TOKEN_PURPOSE, volume_id)


def listed(row: VolumeRow) -> dict[str, Any]:
    return {"volumeID": row.id, "name": row.name}


def with_token(ctx: Caller, row: VolumeRow) -> dict[str, Any]:
    return {**listed(row), "token": volume_token(ctx, row.id)}


@router.post("/volumes", status_code=201)
async def create_volume(body: NewVolume, ctx: E2BCtx) -> dict[str, Any]:
    state = await ctx.control.volumes.create(ctx.workspace_id, body.name, volume_size_bytes())
    return with_token(ctx, state.row)


@router.get("/volumes")
async def list_volumes(ctx: E2BCtx) -> list[dict[str, Any]]:
    return [listed(state.row) for state in await ctx.control.volumes.list_states(ctx.workspace_id)]


@router.get("/volumes/{volume_id}")
async def get_volume(volume_id: str, ctx: E2BCtx) -> dict[str, Any]:
    return with_token(ctx, await ctx.control.volumes.row_by_id(ctx.workspace_id, volume_id))


@router.delete("/volumes/{volume_id}", status_code=204)
async def delete_volume(volume_id: str, ctx: E2BCtx) -> Response:
    row = await ctx.control.volumes.row_by_id(ctx.workspace_id, volume_id)
    await ctx.control.volumes.delete(ctx.workspace_id, row.name)
    return Response(status_code=204)
