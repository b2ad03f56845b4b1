"""Volumes (``/v1/volumes``, PandaStack's routes): named per workspace, data that outlives sandboxes.

- ``POST /v1/volumes`` ``{name, size_mb}``: 201 the volume; 409 when the workspace has one of that name; 429
  past the ``volumes``/``volume_bytes`` quotas.
- ``GET /v1/volumes``: ``{"items": [...]}``; ``GET /v1/volumes/{name}``: the volume (404 across workspaces).
- ``PATCH /v1/volumes/{name}`` ``{size_mb}``: grow it (400 to shrink, 409 while attached).
- ``DELETE /v1/volumes/{name}``: 204; 409 while attached.
- ``POST /v1/volumes/{name}/restore``: a volume whose host is lost, back on a live host from its last stored copy
  (writes after ``stored_at`` are lost, and the answer says so); 409 when its host is up or it was never stored.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from ... import models
from ...util.times import rfc3339
from ..control.volumes import VolumeState
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/volumes", tags=["volumes"], responses=ERROR_RESPONSES)
MIB = 1 << 20


def volume_view(state: VolumeState) -> models.Volume:
    row = state.row
    return models.Volume(
        id=row.id,
        name=row.name,
        size_mb=row.size_bytes // MIB,
        size_bytes=row.size_bytes,
        used_bytes=state.used_bytes,
        filesystem=row.filesystem,
        status=state.status,
        host=row.host or None,
        attached_to=[
            models.VolumeMount(sandbox_id=a.sandbox_id, path=a.path, read_only=a.read_only) for a in row.attachments
        ],
        created_at=rfc3339(row.created_at),
        stored_at=rfc3339(row.stored_at) if row.stored_at is not None else None,
    )


@router.post("", status_code=201, response_model=models.Volume)
async def create_volume(body: models.CreateVolumeRequest, ctx: Ctx) -> models.Volume:
    """Make a volume: an ext4 file system of ``size_mb`` (labelled ``fcvol-<name>``, 16 bytes kept)."""
    return volume_view(await ctx.control.volumes.create(ctx.workspace_id, body.name, body.size_mb * MIB))


@router.get("", response_model=models.VolumeList)
async def list_volumes(ctx: Ctx) -> models.VolumeList:
    return models.VolumeList(items=[volume_view(s) for s in await ctx.control.volumes.list_states(ctx.workspace_id)])


@router.get("/{name}", response_model=models.Volume)
async def get_volume(name: str, ctx: Ctx) -> models.Volume:
    return volume_view(await ctx.control.volumes.get(ctx.workspace_id, name))


@router.patch("/{name}", response_model=models.Volume)
async def resize_volume(name: str, body: models.ResizeVolumeRequest, ctx: Ctx) -> models.Volume:
    """Grow the volume; its file system grows in the guest when it is next mounted."""
    return volume_view(await ctx.control.volumes.resize(ctx.workspace_id, name, body.size_mb * MIB))


@router.delete("/{name}", status_code=204, response_class=Response)
async def delete_volume(name: str, ctx: Ctx) -> Response:
    await ctx.control.volumes.delete(ctx.workspace_id, name)
    return Response(status_code=204)


@router.post("/{name}/restore", response_model=models.VolumeRestored)
async def restore_volume(name: str, ctx: Ctx) -> models.VolumeRestored:
    """Bring a lost volume back from its last stored copy; writes made after that copy are lost."""
    done = await ctx.control.volumes.restore(ctx.workspace_id, name)
    since = rfc3339(done.stored_at)
    return models.VolumeRestored(
        volume=volume_view(await ctx.control.volumes.get(ctx.workspace_id, name)),
        lost_host=done.lost_host,
        restored_from=since,
        message=f"volume {name!r} restored from its copy stored at {since}: writes made on {done.lost_host} "
        "after that are lost",
    )
