"""The code interpreter of a sandbox (``code-interpreter`` template): cells run in Jupyter kernels of the guest's
kernel server (port 49999, reached through the sandbox's agent: :mod:`.code_client`).

- ``POST /v1/sandboxes/{id}/code/run`` ``{code, context_id?, timeout_seconds? (60; null: no limit), env?}`` →
  ``CodeExecution`` ``{results, stdout, stderr, error: {name, value, traceback} | null, execution_count,
  duration_ms}``. A timed-out cell was interrupted: its ``error`` is a ``TimeoutError`` and the context keeps its
  state. A cell that raised is a 200 too (its ``error`` says how).
- ``POST …/code/run/stream``: the same as server-sent events while the cell runs: ``stdout`` / ``stderr``
  ``{text}``, ``result`` (a ``CodeResult``), ``error`` (the cell's exception), then ``end`` ``{execution_count,
  duration_ms}``. An error before the first event is a plain error response; a failure of the platform after it
  is one ``failure`` event ``{error, code, details}`` and no ``end``.
- ``GET|POST …/code/contexts`` (``{language?, cwd?}`` → 201 ``CodeContext``), ``DELETE …/code/contexts/{cid}``
  (the ``default`` context cannot be removed: 400) and ``POST …/code/contexts/{cid}/restart`` (a fresh kernel,
  its state gone), both 204.

A sandbox without a code interpreter (template ``base``) answers 409 ``wrong_state``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Response
from fastapi.responses import StreamingResponse

from ... import models
from ...errors import CryoboxError
from .code_client import collect, error_of, for_sandbox, primed, result_of
from .deps import Ctx
from .errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/sandboxes", tags=["code"], responses=ERROR_RESPONSES)

ContextPath = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def result_event(line: Mapping[str, Any]) -> dict[str, Any]:
    """A ``result`` line as the API's ``CodeResult`` (every field, ``json`` under its wire name)."""
    return models.CodeResult.model_validate(result_of(line)).model_dump(mode="json", by_alias=True)


@router.post("/{sandbox_id}/code/run", response_model=models.CodeExecution)
async def run_code(sandbox_id: str, body: models.CodeRunRequest, ctx: Ctx) -> models.CodeExecution:
    started = time.monotonic()
    client = await for_sandbox(ctx, sandbox_id)
    lines = client.execute(body.code, context_id=body.context_id, timeout_s=body.timeout_seconds, env=body.env)
    async with contextlib.aclosing(lines):
        return models.CodeExecution.model_validate(await collect(lines, started=started))


@router.post(
    "/{sandbox_id}/code/run/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
)
async def run_code_stream(sandbox_id: str, body: models.CodeRunRequest, ctx: Ctx) -> StreamingResponse:
    started = time.monotonic()
    client = await for_sandbox(ctx, sandbox_id)  # plain 404/409 errors, not a stream
    lines = await primed(
        client.execute(body.code, context_id=body.context_id, timeout_s=body.timeout_seconds, env=body.env)
    )

    async def events() -> AsyncIterator[bytes]:
        try:
            async for line in lines:
                kind = line["type"]
                if kind in ("stdout", "stderr"):
                    yield sse(kind, {"text": str(line.get("text", ""))})
                elif kind == "result":
                    yield sse("result", result_event(line))
                elif kind == "error":
                    yield sse("error", error_of(line))
                elif kind == "number_of_executions":
                    count = line.get("execution_count")
                    end = models.CodeRunEnd(
                        execution_count=count if isinstance(count, int) else None,
                        duration_ms=round((time.monotonic() - started) * 1000, 3),
                    )
                    yield sse("end", end.model_dump())
                    return
            ended = {"error": "the code interpreter's stream ended before the cell finished", "code": "guest_error"}
            yield sse("failure", {**ended, "details": {}})
        except CryoboxError as err:
            yield sse("failure", {"error": err.message, "code": err.code, "details": err.details})
        finally:
            await lines.aclose()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/{sandbox_id}/code/contexts", response_model=models.CodeContextList)
async def list_contexts(sandbox_id: str, ctx: Ctx) -> models.CodeContextList:
    client = await for_sandbox(ctx, sandbox_id)
    return models.CodeContextList(items=[models.CodeContext.model_validate(c) for c in await client.contexts()])


@router.post("/{sandbox_id}/code/contexts", status_code=201, response_model=models.CodeContext)
async def create_context(
    sandbox_id: str,
    ctx: Ctx,
    body: Annotated[models.CodeContextRequest, Body(default_factory=models.CodeContextRequest)],
) -> models.CodeContext:
    """A new kernel: its variables are its own (a name set in another context is a ``NameError`` here)."""
    client = await for_sandbox(ctx, sandbox_id)
    return models.CodeContext.model_validate(await client.create_context(body.language, body.cwd))


@router.delete("/{sandbox_id}/code/contexts/{context_id}", status_code=204, response_class=Response)
async def remove_context(sandbox_id: str, context_id: ContextPath, ctx: Ctx) -> Response:
    await (await for_sandbox(ctx, sandbox_id)).remove_context(context_id)
    return Response(status_code=204)


@router.post("/{sandbox_id}/code/contexts/{context_id}/restart", status_code=204, response_class=Response)
async def restart_context(sandbox_id: str, context_id: ContextPath, ctx: Ctx) -> Response:
    await (await for_sandbox(ctx, sandbox_id)).restart_context(context_id)
    return Response(status_code=204)
