"""PandaStack's code-interpreter routes, for its unchanged SDK (``Sandbox.create_code_context()`` → ``CodeContext``
with ``run_code`` and ``close``), over the same kernel server as ``/v1/sandboxes/{id}/code/…``
(:mod:`cryobox.server.routes.code`).

- ``POST /v1/sandboxes/{id}/repl/sessions`` ``{language}`` → 201 ``{id, language}`` (a new context);
- ``POST …/repl/sessions/{sid}/run`` ``{code, timeout_ms?}`` and ``POST /v1/sandboxes/{id}/repl`` ``{code,
  language?, timeout_ms?}`` (one cell in the default context) → ``{results: [MIME bundles], stdout, stderr, error:
  <formatted traceback> | null, exit_code: 0 | 1, duration_ms}`` (``ReplExecution``);
- ``DELETE …/repl/sessions/{sid}`` → 204.

A result is a MIME bundle as PandaStack's ``Result.data`` holds it (``{"text/plain": …, "text/html": …,
"image/png": <base64>}``; JSON as JSON text). ``timeout_ms`` (default 60 s) interrupts the cell: the answer is then 504
``timeout`` whose message says "timeout", which the SDK's ``_maybe_timeout`` turns into ``SandboxTimeout``; the
session keeps its state and its next cell runs as usual.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Response

from ... import models
from ...errors import InvalidArgument, SandboxTimeout
from ...models.code import DEFAULT_TIMEOUT_S
from ...server.routes.code_client import CodeClient, collect, for_sandbox
from ...server.routes.deps import Ctx
from ...server.routes.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/sandboxes", tags=["repl"], responses=ERROR_RESPONSES)

SessionPath = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]
PYTHON = {"python", "python3", "py"}
MIME_TYPES = {
    "text": "text/plain",
    "html": "text/html",
    "markdown": "text/markdown",
    "svg": "image/svg+xml",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "pdf": "application/pdf",
    "latex": "text/latex",
    "json": "application/json",
    "javascript": "application/javascript",
}
INTERRUPTED = ("KernelRestarted",)
"""Errors the kernel server reports for a cell stopped by its deadline besides its ``TimeoutError``."""


def mime_bundle(result: Mapping[str, Any]) -> dict[str, str]:
    """A result object as PandaStack's MIME bundle (every value a string: JSON as JSON text)."""
    bundle: dict[str, str] = {}
    items = [(MIME_TYPES[k], v) for k, v in result.items() if k in MIME_TYPES and v is not None]
    extra = result.get("extra")
    items += list(extra.items()) if isinstance(extra, dict) else []
    for mime, value in items:
        bundle[str(mime)] = value if isinstance(value, str) else json.dumps(value)
    return bundle


def timed_out(error: Mapping[str, str] | None) -> bool:
    """The cell was interrupted by its deadline (not a ``TimeoutError`` of its own, which has a traceback)."""
    if error is None:
        return False
    if error["name"] in INTERRUPTED:
        return True
    return error["name"] == "TimeoutError" and not error["traceback"] and error["value"].startswith("execution timed")


def formatted(error: Mapping[str, str]) -> str:
    return error["traceback"] or f"{error['name']}: {error['value']}"


async def _run(client: CodeClient, code: str, context_id: str | None, timeout_ms: int | None) -> models.ReplExecution:
    started = time.monotonic()
    timeout_s = timeout_ms / 1000 if timeout_ms is not None else DEFAULT_TIMEOUT_S
    lines = client.execute(code, context_id=context_id, timeout_s=timeout_s)
    async with contextlib.aclosing(lines):
        execution = await collect(lines, started=started)
    error = execution["error"]
    if timed_out(error):
        raise SandboxTimeout(
            f"cell timeout: the code ran past {timeout_s:g}s and was interrupted (timeout_ms reached; the session "
            "keeps its state)",
            details={"stdout": execution["stdout"], "stderr": execution["stderr"], "timeout_ms": int(timeout_s * 1000)},
        )
    return models.ReplExecution(
        results=[mime_bundle(r) for r in execution["results"]],
        stdout=execution["stdout"],
        stderr=execution["stderr"],
        error=formatted(error) if error is not None else None,
        exit_code=1 if error is not None else 0,
        duration_ms=int(execution["duration_ms"]),
    )


@router.post("/{sandbox_id}/repl/sessions", status_code=201, response_model=models.ReplSession)
async def create_session(
    sandbox_id: str,
    ctx: Ctx,
    body: Annotated[models.ReplSessionRequest, Body(default_factory=models.ReplSessionRequest)],
) -> models.ReplSession:
    language = "python" if body.language.lower() in PYTHON else body.language
    made = await (await for_sandbox(ctx, sandbox_id)).create_context(language)
    return models.ReplSession(id=str(made["id"]), language=str(made.get("language") or language))


@router.post("/{sandbox_id}/repl/sessions/{session_id}/run", response_model=models.ReplExecution)
async def run_in_session(
    sandbox_id: str, session_id: SessionPath, body: models.ReplRunRequest, ctx: Ctx
) -> models.ReplExecution:
    return await _run(await for_sandbox(ctx, sandbox_id), body.code, session_id, body.timeout_ms)


@router.delete("/{sandbox_id}/repl/sessions/{session_id}", status_code=204, response_class=Response)
async def close_session(sandbox_id: str, session_id: SessionPath, ctx: Ctx) -> Response:
    await (await for_sandbox(ctx, sandbox_id)).remove_context(session_id)
    return Response(status_code=204)


@router.post("/{sandbox_id}/repl", response_model=models.ReplExecution)
async def run_once(sandbox_id: str, body: models.ReplRequest, ctx: Ctx) -> models.ReplExecution:
    """One cell in the sandbox's default context (its state is shared by every one-shot call)."""
    if body.language is not None and body.language.lower() not in PYTHON:
        raise InvalidArgument(f"language {body.language!r} is not available (python is)")
    return await _run(await for_sandbox(ctx, sandbox_id), body.code, None, body.timeout_ms)
