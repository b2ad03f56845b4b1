"""The agent HTTP server's framing of streams and raw bodies: NDJSON answers (exec, terminals, processes, watches,
template builds) and reading raw request bodies (files, evidence, terminal input) up to a limit.

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
from fastapi import Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from ..errors import CryoboxError, HostUnavailable, QuotaExceeded

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"


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


__all__ = [
    "NDJSON",
    "error_line",
    "event_line",
    "ndjson_response",
]
