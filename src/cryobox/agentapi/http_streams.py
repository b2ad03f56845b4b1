"""The agent HTTP server's streamed and raw-body routes: NDJSON streams (exec, terminals, template builds),
raw file and evidence bodies, terminal input.

A stream is ``application/x-ndjson``, one JSON object per line: ``{"event": <model>}`` per item, and, if the agent
fails after the first item, a last ``{"error": <CryoboxError.to_wire()>}`` line (``HostUnavailable`` and
``QuotaExceeded`` add ``"retry_after_s"`` beside it). The first item is fetched before the response starts, so a
failure before it is an ordinary error response with its status.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from ..errors import CryoboxError, HostUnavailable, PayloadTooLarge, QuotaExceeded
from . import models as m
from .interface import MAX_FILE_BYTES, Agent

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"
MAX_PTY_INPUT_BYTES = 1 << 20
PathQuery = Query(min_length=1, max_length=4096, description="absolute path inside the guest")
UserQuery = Query(default=None, min_length=1, max_length=64, description="the guest user to own what is written")


class PtyResize(BaseModel):
    cols: int
    rows: int


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, separators=(",", ":"), default=str) + "\n").encode()


def event_line(item: BaseModel) -> bytes:
    return b'{"event":' + item.model_dump_json().encode() + b"}\n"


def error_line(exc: CryoboxError) -> bytes:
    line: dict[str, Any] = {"error": exc.to_wire()}
    if isinstance(exc, HostUnavailable | QuotaExceeded):
        line["retry_after_s"] = exc.retry_after_s
    return _dumps(line)


async def close_stream(stream: AsyncIterator[Any]) -> None:
    """Close an agent's iterator (its ``finally`` blocks run), even while the request is being cancelled."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await aclose()
        except Exception:
            log.warning("closing an agent stream failed", exc_info=True)


async def _lines(first: BaseModel, stream: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    try:
        yield event_line(first)
        async for item in stream:
            yield event_line(item)
    except CryoboxError as exc:
        if exc.http_status >= 500:
            log.warning("agent stream failed: %s", exc, exc_info=exc.http_status == 500)
        yield error_line(exc)
    except Exception:
        log.exception("agent stream failed")
        yield error_line(CryoboxError("internal error"))
    finally:
        await close_stream(stream)


async def _no_lines() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


async def ndjson_response(stream: AsyncIterator[BaseModel]) -> Response:
    """Start ``stream`` and answer with it; an error before its first item propagates (a normal error response)."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        return StreamingResponse(_no_lines(), media_type=NDJSON)
    except BaseException:
        await close_stream(stream)
        raise
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    # the background task closes the agent's stream even when the client left before the first line was sent
    closer = BackgroundTask(close_stream, stream)
    return StreamingResponse(_lines(first, stream), media_type=NDJSON, headers=headers, background=closer)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with ``PayloadTooLarge`` as soon as it (declared or received) passes ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds {limit}", details={"limit": limit})
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"body exceeds {limit} bytes", details={"limit": limit})
    return bytes(body)


def add_stream_routes(router: APIRouter, agent: Agent) -> None:
    """Streams and raw bodies: exec/stream, files, terminals, evidence, template builds."""

    @router.post("/sandboxes/{sandbox_id}/exec/stream", response_class=StreamingResponse)
    async def exec_stream(sandbox_id: str, body: m.ExecRequest) -> Response:
        return await ndjson_response(agent.exec_stream(sandbox_id, body))

    @router.get("/sandboxes/{sandbox_id}/files", response_class=Response)
    async def read_file(sandbox_id: str, path: str = PathQuery) -> Response:
        data = await agent.read_file(sandbox_id, path)
        return Response(content=data, media_type="application/octet-stream")

    @router.put("/sandboxes/{sandbox_id}/files")
    async def write_file(
        sandbox_id: str, request: Request, path: str = PathQuery, user: str | None = UserQuery
    ) -> m.WriteResult:
        data = await read_body(request, MAX_FILE_BYTES)
        return await agent.write_file(sandbox_id, path, data, user=user)

    @router.post("/sandboxes/{sandbox_id}/pty", response_class=StreamingResponse)
    async def pty_open(sandbox_id: str, body: m.PtyOpen) -> Response:
        return await ndjson_response(agent.pty_open(sandbox_id, body))

    @router.post("/sandboxes/{sandbox_id}/pty/{session}/input", status_code=204)
    async def pty_input(sandbox_id: str, session: str, request: Request) -> Response:
        await agent.pty_input(sandbox_id, session, await read_body(request, MAX_PTY_INPUT_BYTES))
        return Response(status_code=204)

    @router.post("/sandboxes/{sandbox_id}/pty/{session}/resize", status_code=204)
    async def pty_resize(sandbox_id: str, session: str, body: PtyResize) -> Response:
        await agent.pty_resize(sandbox_id, session, body.cols, body.rows)
        return Response(status_code=204)

    @router.post("/sandboxes/{sandbox_id}/pty/{session}/close", status_code=204)
    async def pty_close(sandbox_id: str, session: str) -> Response:
        await agent.pty_close(sandbox_id, session)
        return Response(status_code=204)

    @router.get("/snapshots/{snapshot_id}/evidence/{name:path}", response_class=Response)
    async def evidence_read(snapshot_id: str, name: str) -> Response:
        data = await agent.evidence_read(snapshot_id, name)
        return Response(content=data, media_type="application/octet-stream")

    @router.put("/snapshots/{snapshot_id}/evidence/{name:path}")
    async def evidence_put(snapshot_id: str, name: str, request: Request) -> dict[str, int]:
        data = await read_body(request, MAX_FILE_BYTES)
        return {"bytes": await agent.evidence_put(snapshot_id, name, data)}

    @router.post("/templates", response_class=StreamingResponse)
    async def build_template(body: m.TemplateBuild) -> Response:
        return await ndjson_response(agent.build_template(body))


__all__ = [
    "MAX_FILE_BYTES",
    "NDJSON",
    "PtyResize",
    "add_stream_routes",
    "error_line",
    "event_line",
    "ndjson_response",
    "read_body",
]
