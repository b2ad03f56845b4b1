"""File routes: paths are inside the guest; bodies are raw bytes.

``/fs`` takes the API key; ``POST /files/url`` hands out a signed URL (``operation`` ``read`` or ``write``, as E2B's
file URL signatures name them) that ``GET`` / ``PUT`` ``/files/signed`` then serves with no key
(:mod:`~cryobox.server.access.fileurls`: a cryobox route whose path names the sandbox, so the URL works with any
HTTP client, no header, host name or sandbox URL needed).
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from ... import models
from ...agentapi import MAX_FILE_BYTES
from ...agentapi import models as am
from ...agentapi.interface import Agent
from ...errors import InvalidArgument
from ...util.httpbody import read_body
from ...util.times import rfc3339
from ..access.fileurls import METHODS, FileGrant, Operation, check, grant_of
from .deps import AppContext, Ctx, PublicCtx
from .errors import ERROR_RESPONSES
from .views import file_entry

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}", tags=["files"], responses=ERROR_RESPONSES)
PathQuery = Query(min_length=1, max_length=4096, description="absolute path inside the guest")


def checked(path: str) -> str:
    if not path.startswith("/") or "\x00" in path:
        raise InvalidArgument("path must be absolute", details={"path": path})
    return path


@router.get("/fs", response_class=Response, responses={200: {"content": {"application/octet-stream": {}}}})
async def read_file(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> Response:
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    data = await agent.read_file(sandbox_id, checked(path))
    return Response(content=data, media_type="application/octet-stream")


@router.put("/fs", response_model=models.WriteResult)
async def write_file(sandbox_id: str, request: Request, ctx: Ctx, path: str = PathQuery) -> models.WriteResult:
    checked(path)
    agent = await ctx.control.agent_for(sandbox_id, ctx.workspace_id)
    body = await read_body(request, MAX_FILE_BYTES)
    result = await agent.write_file(sandbox_id, path, body)
    return models.WriteResult(path=result.path, bytes=result.bytes)


@router.delete("/fs", status_code=204)
async def delete_file(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> Response:
    await _op(ctx, sandbox_id, "delete", path)
    return Response(status_code=204)


@router.get("/fs/dir", response_model=models.DirListing)
async def list_dir(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> models.DirListing:
    listing = await _op(ctx, sandbox_id, "list_dir", path)
    return models.DirListing(path=path, entries=[file_entry(e) for e in listing.entries or []])


@router.get("/fs/stat", response_model=models.FileEntry)
async def stat(sandbox_id: str, ctx: Ctx, path: str = PathQuery) -> models.FileEntry:
    return file_entry(await _op(ctx, sandbox_id, "stat", path))


async def _op(ctx: Ctx, sandbox_id: str, op: str, path: str) -> am.FsReply:
    checked(path)
    return await (await ctx.control.agent_for(sandbox_id, ctx.workspace_id)).file_op(sandbox_id, op, path)


@router.post("/files/url", response_model=models.FileUrl)
async def file_url(sandbox_id: str, body: models.FileUrlRequest, request: Request, ctx: Ctx) -> models.FileUrl:
    """ext: a URL that reads (``GET``) or writes (``PUT``) ``path`` with no API key, for ``expires_in`` seconds."""
    checked(body.path)
    if body.user is not None and body.operation != "write":
        raise InvalidArgument("user: only a write URL names a user (what it creates belongs to them)")
    await ctx.control.row(sandbox_id, ctx.workspace_id)  # 404 for another workspace's; a hibernated one sleeps on
    expires = int(ctx.control.fleet.clock()) + body.expires_in
    grant = FileGrant(sandbox_id, body.operation, body.path, expires, body.user)
    url = request.url_for("signed_file_read", sandbox_id=sandbox_id)
    signed = url.include_query_params(**grant.query(ctx.control.registry.sealer))
    return models.FileUrl(url=str(signed), method=METHODS[body.operation], expires_at=rfc3339(expires))


async def _granted(app: AppContext, sandbox_id: str, request: Request, operation: Operation) -> tuple[FileGrant, Agent]:
    """The signed request's grant, once its signature checks out (before anything else is read), and the agent."""
    grant, signature = grant_of(sandbox_id, operation, dict(request.query_params))
    check(app.control.registry.sealer, grant, signature, app.control.fleet.clock())
    row, agent = await app.control.route(sandbox_id, None)
    app.limiter.check(row.workspace_id)
    return grant, agent


@router.get(
    "/files/signed",
    name="signed_file_read",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def signed_read(sandbox_id: str, request: Request, app: PublicCtx) -> Response:
    """ext: a signed ``read`` URL (no API key): the file's bytes."""
    grant, agent = await _granted(app, sandbox_id, request, "read")
    data = await agent.read_file(sandbox_id, checked(grant.path))
    return Response(content=data, media_type="application/octet-stream")


@router.put("/files/signed", response_model=models.WriteResult)
async def signed_write(sandbox_id: str, request: Request, app: PublicCtx) -> models.WriteResult:
    """ext: a signed ``write`` URL (no API key): the raw body becomes the file."""
    grant, agent = await _granted(app, sandbox_id, request, "write")
    body = await read_body(request, MAX_FILE_BYTES)
    result = await agent.write_file(sandbox_id, checked(grant.path), body, user=grant.user)
    return models.WriteResult(path=result.path, bytes=result.bytes)
