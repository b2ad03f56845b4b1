"""Sandbox lifecycle and command routes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from .. import models
from ..agent.exec import ExecSpec
from ..errors import CryoboxError, InvalidArgument, SandboxTimeout
from .deps import Ctx
from .views import sandbox_view

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])


@router.post("", status_code=201, response_model=models.Sandbox)
async def create_sandbox(body: models.CreateSandboxRequest, ctx: Ctx) -> models.Sandbox:
    if body.from_snapshot is not None:
        raise InvalidArgument("from_snapshot is not supported by this server yet", details={"field": "from_snapshot"})
    sandbox = await ctx.service.create(
        body.template, metadata=body.metadata, env=body.env, ttl_s=body.ttl_seconds, persistent=body.persistent
    )
    return sandbox_view(sandbox, ctx.host)


@router.get("", response_model=models.SandboxList)
async def list_sandboxes(request: Request, ctx: Ctx, status: str | None = None) -> models.SandboxList:
    wanted = {k[len("metadata.") :]: v for k, v in request.query_params.items() if k.startswith("metadata.")}
    items = [
        sandbox_view(s, ctx.host)
        for s in ctx.service.all()
        if (status is None or s.state.value == status) and all(s.metadata.get(k) == v for k, v in wanted.items())
    ]
    return models.SandboxList(items=items)


@router.get("/{sandbox_id}", response_model=models.Sandbox)
async def get_sandbox(sandbox_id: str, ctx: Ctx) -> models.Sandbox:
    return sandbox_view(ctx.service.get(sandbox_id), ctx.host)


@router.delete("/{sandbox_id}", status_code=204)
async def delete_sandbox(sandbox_id: str, ctx: Ctx) -> Response:
    await ctx.service.delete(sandbox_id)
    return Response(status_code=204)


def exec_spec(body: models.ExecRequest) -> ExecSpec:
    stdin = None
    if body.stdin is not None:
        stdin = body.stdin.encode()
    return ExecSpec(cmd=body.cmd, timeout_s=body.timeout_seconds, env=body.env, cwd=body.cwd, stdin=stdin)


@router.post("/{sandbox_id}/exec", response_model=models.ExecResponse)
async def exec_command(sandbox_id: str, body: models.ExecRequest, ctx: Ctx) -> models.ExecResponse:
    result = await ctx.service.exec(sandbox_id, exec_spec(body))
    if result.timed_out:
        raise SandboxTimeout(
            f"command timed out after {body.timeout_seconds}s (process group killed)",
            details={
                "stdout": result.stdout,
                "stderr": result.stderr,
                "exit_code": result.exit_code,
                "timeout_seconds": body.timeout_seconds,
            },
        )
    return models.ExecResponse(
        stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code, duration_ms=result.duration_ms
    )


def _sse(event: str, data: dict[str, object]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@router.post(
    "/{sandbox_id}/exec/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def exec_stream(sandbox_id: str, body: models.ExecRequest, ctx: Ctx) -> StreamingResponse:
    ctx.service.get(sandbox_id).require_running()  # unknown id / wrong state: a plain error, not a stream
    spec = exec_spec(body)

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in ctx.service.exec_stream(sandbox_id, spec):
                if event.kind == "exit" and event.result is not None:
                    if event.result.timed_out:
                        yield _sse(
                            "error", {"error": f"command timed out after {body.timeout_seconds}s", "code": "timeout"}
                        )
                    else:
                        yield _sse("exit", {"exit_code": event.result.exit_code})
                    return
                yield _sse(event.kind, {"chunk": event.text})
        except CryoboxError as err:
            yield _sse("error", {"error": err.message, "code": err.code})

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
