"""File routes: paths are inside the guest; bodies are raw bytes."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from ... import models
from ...agentapi import MAX_FILE_BYTES
from ...agentapi import models as am
from ...errors import InvalidArgument
from ...util.httpbody import read_body
from .deps import Ctx
from .errors import ERROR_RESPONSES
from .views import file_entry

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/fs", tags=["files"], responses=ERROR_RESPONSES)
PathQuery = Query(min_length=1, max_length=4096, description="absolute path inside the guest")


def checked(path: str) -> str:
    if not path.startswith("/") or "\x00" in path:
        raise InvalidArgument("path must be absolute", details={"path": path})
    return path


@router.get("", response_class=Response, responses={200: {"content": {"application/octet-stream": {}}}})
async def read_file(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> Response:
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    data = await agent.read_file(sandbox_id, checked(path))
    return Response(content=data, media_type="application/octet-stream")


@router.put("", response_model=models.WriteResult)
async def write_file(sandbox_id: str, request: Request, ctx: Ctx, path: str = PathQuery) -> models.WriteResult:
    checked(path)
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    body = await read_body(request, MAX_FILE_BYTES)
    result = await agent.write_file(sandbox_id, path, body)
    return models.WriteResult(path=result.path, bytes=result.bytes)


@router.delete("", status_code=204)
async def delete_file(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> Response:
    await _op(ctx, sandbox_id, "delete", path)
    return Response(status_code=204)


@router.get("/dir", response_model=models.DirListing)
async def list_dir(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> models.DirListing:
    listing = await _op(ctx, sandbox_id, "list_dir", path)
    return models.DirListing(path=path, entries=[file_entry(e) for e in listing.entries or []])


@router.get("/stat", response_model=models.FileEntry)
async def stat(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> models.FileEntry:
    return file_entry(await _op(ctx, sandbox_id, "stat", path))


async def _op(ctx: Ctx, sandbox_id: str, op: str, path: str) -> am.FsReply:
    checked(path)
    return await (await ctx.control.agent_for(sandbox_id, ctx.workspace_id)).file_op(sandbox_id, op, path)
