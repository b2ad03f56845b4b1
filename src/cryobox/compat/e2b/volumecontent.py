"""E2B's volume content API (``/e2b/volumecontent/{volumeID}/…``), as the ``e2b`` 2.63 SDK's ``Volume`` instance
methods call it (``E2B_VOLUME_API_URL``, which ``cryobox serve`` prints): the bearer token is the volume's
``token`` (:func:`.volumes.volume_token`) and no API key; statuses are exactly the SDK's (201 for a directory made
and a file written, 204 for a removal, 404 with a JSON error body for a path that is not there). The files are
read and written in a system sandbox with the volume mounted (:mod:`cryobox.server.control.volumecontent`): 409
while a sandbox has it mounted read-write (and for writes while sandboxes read it).

Entries are ``VolumeEntryStat``: ``{name, type: file|directory|symlink|unknown, path, size, mode, uid, gid,
atime, mtime, ctime, target?}`` with paths absolute in the volume and times in RFC 3339.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ...agentapi import MAX_FILE_BYTES
from ...errors import NotFound, Unauthorized
from ...registry.volumes import VolumeRecords, VolumeRow
from ...server.access.gate import bearer_key
from ...server.control.volumecontent import Meta, VolumeContent
from ...server.routes.deps import AppContext, context
from ...server.routes.volumefiles import Id, Mode, Path, volume_entry
from ...util.httpbody import read_body
from .routing import E2BRoute
from .volumes import TOKEN_PURPOSE

router = APIRouter(prefix="/e2b/volumecontent", route_class=E2BRoute, include_in_schema=False)


class Holder:
    """The volume a request's bearer token opens, and the content service."""

    def __init__(self, row: VolumeRow, content: VolumeContent) -> None:
        self.row = row
        self.content = content


async def holder(volume_id: str, request: Request, ctx: Annotated[AppContext, Depends(context)]) -> Holder:
    token = bearer_key(request.headers.get("authorization"))
    sealer = ctx.control.registry.sealer
    if not token or not sealer.verify_mac(TOKEN_PURPOSE, volume_id, token):
        raise Unauthorized("missing or wrong volume token (Authorization: Bearer <the volume's token>)")
    try:
        row = await asyncio.to_thread(VolumeRecords(ctx.control.registry.database).by_id, volume_id)
    except NotFound:
        row = None
    if row is None:
        raise NotFound(f"volume {volume_id[:80]} not found", details={"volume_id": volume_id[:80]})
    ctx.limiter.check(row.workspace_id)
    return Holder(row, ctx.control.volume_content)


Volume = Annotated[Holder, Depends(holder)]


def entry(raw: dict[str, Any]) -> dict[str, Any]:
    """The guest's entry as E2B's ``VolumeEntryStat`` (``/v1``'s ``VolumeEntry``: the same fields)."""
    return volume_entry(raw).model_dump(exclude_none=True)


@router.get("/{volume_id}/dir")
async def list_dir(vol: Volume, path: Path, depth: Annotated[int, Query(ge=1, le=64)] = 1) -> list[dict[str, Any]]:
    return [entry(e) for e in await vol.content.list(vol.row, path, depth)]


@router.post("/{volume_id}/dir", status_code=201)
async def make_dir(
    vol: Volume, path: Path, uid: Id = None, gid: Id = None, mode: Mode = None, force: bool = False
) -> dict[str, Any]:
    return entry(await vol.content.mkdir(vol.row, path, Meta(uid, gid, mode), force=force))


@router.get("/{volume_id}/path")
async def stat_path(vol: Volume, path: Path) -> dict[str, Any]:
    return entry(await vol.content.stat(vol.row, path))


class MetaPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uid: int | None = Field(default=None, ge=0, le=1 << 31)
    gid: int | None = Field(default=None, ge=0, le=1 << 31)
    mode: int | None = Field(default=None, ge=0, le=0o7777)


@router.patch("/{volume_id}/path")
async def update_metadata(vol: Volume, path: Path, body: MetaPatch) -> dict[str, Any]:
    return entry(await vol.content.chmeta(vol.row, path, Meta(body.uid, body.gid, body.mode)))


@router.delete("/{volume_id}/path", status_code=204)
async def remove_path(vol: Volume, path: Path) -> Response:
    await vol.content.remove(vol.row, path)
    return Response(status_code=204)


@router.get("/{volume_id}/file")
async def read_file(vol: Volume, path: Path) -> Response:
    data = await vol.content.read(vol.row, path)
    return Response(content=data, media_type="application/octet-stream")


@router.put("/{volume_id}/file", status_code=201)
async def write_file(
    vol: Volume,
    request: Request,
    path: Path,
    uid: Id = None,
    gid: Id = None,
    mode: Mode = None,
    force: bool | None = None,
) -> dict[str, Any]:
    data = await read_body(request, MAX_FILE_BYTES)
    return entry(await vol.content.write(vol.row, path, data, Meta(uid, gid, mode), force=force))
