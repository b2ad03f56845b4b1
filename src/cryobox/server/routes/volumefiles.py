"""A volume's files without a sandbox of the caller's (``/v1/volumes/{name}/…``; what ``cryobox volume cp`` and the
SDK's ``Volumes.read_file``/``write_file`` use), read and written in a system sandbox with the volume mounted
(:mod:`..control.volumecontent`): 409 while a sandbox has the volume mounted read-write (writes: also while
sandboxes read it). Paths are absolute in the volume.

- ``GET /v1/volumes/{name}/files?path=``: the file's bytes; ``PUT`` (the body): 201 the entry (``overwrite=false``
  refuses an existing file with 409; ``uid``/``gid``/``mode`` default to the volume root's owner and 0644);
  ``DELETE``: 204 (a directory with everything in it).
- ``GET /v1/volumes/{name}/entries?path=/&depth=1``: ``{"items": [VolumeEntry…]}``; ``GET …/stat?path=``: one.
- ``POST /v1/volumes/{name}/dirs?path=&parents=``: 201 the directory.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from ... import models
from ...agentapi import MAX_FILE_BYTES
from ...registry.volumes import VolumeRow
from ...util.httpbody import read_body
from ...util.times import rfc3339
from ..control.volumecontent import Meta
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/volumes", tags=["volumes"], responses=ERROR_RESPONSES)
Path = Annotated[str, Query(min_length=1, max_length=4096, description="absolute in the volume")]
Id = Annotated[int | None, Query(ge=0, le=(1 << 31))]
Mode = Annotated[int | None, Query(ge=0, le=0o7777)]


def volume_entry(raw: dict[str, Any]) -> models.VolumeEntry:
    keys = ("name", "type", "path", "size", "mode", "uid", "gid", "target")
    fields: dict[str, Any] = {k: raw[k] for k in keys if k in raw}
    fields.update({k: rfc3339(float(raw[k])) for k in ("atime", "mtime", "ctime")})
    return models.VolumeEntry.model_validate(fields)


async def _row(ctx: Ctx, name: str) -> VolumeRow:
    return await asyncio.to_thread(ctx.control.volumes.records.get, ctx.workspace_id, name)


@router.get("/{name}/files", response_class=Response, responses={200: {"content": {"application/octet-stream": {}}}})
async def read_volume_file(name: str, path: Path, ctx: Ctx) -> Response:
    data = await ctx.control.volume_content.read(await _row(ctx, name), path)
    return Response(content=data, media_type="application/octet-stream")


@router.put("/{name}/files", status_code=201, response_model=models.VolumeEntry)
async def write_volume_file(
    name: str,
    path: Path,
    request: Request,
    ctx: Ctx,
    overwrite: bool = True,
    uid: Id = None,
    gid: Id = None,
    mode: Mode = None,
) -> models.VolumeEntry:
    row = await _row(ctx, name)
    data = await read_body(request, MAX_FILE_BYTES)
    raw = await ctx.control.volume_content.write(row, path, data, Meta(uid, gid, mode), force=overwrite)
    return volume_entry(raw)


@router.delete("/{name}/files", status_code=204, response_class=Response)
async def remove_volume_path(name: str, path: Path, ctx: Ctx) -> Response:
    await ctx.control.volume_content.remove(await _row(ctx, name), path)
    return Response(status_code=204)


@router.get("/{name}/entries", response_model=models.VolumeEntryList)
async def list_volume_entries(
    name: str, ctx: Ctx, path: Path = "/", depth: Annotated[int, Query(ge=1, le=64)] = 1
) -> models.VolumeEntryList:
    found = await ctx.control.volume_content.list(await _row(ctx, name), path, depth)
    return models.VolumeEntryList(items=[volume_entry(e) for e in found])


@router.get("/{name}/stat", response_model=models.VolumeEntry)
async def stat_volume_path(name: str, path: Path, ctx: Ctx) -> models.VolumeEntry:
    return volume_entry(await ctx.control.volume_content.stat(await _row(ctx, name), path))


@router.post("/{name}/dirs", status_code=201, response_model=models.VolumeEntry)
async def make_volume_dir(
    name: str, path: Path, ctx: Ctx, parents: bool = False, uid: Id = None, gid: Id = None, mode: Mode = None
) -> models.VolumeEntry:
    raw = await ctx.control.volume_content.mkdir(await _row(ctx, name), path, Meta(uid, gid, mode), force=parents)
    return volume_entry(raw)
