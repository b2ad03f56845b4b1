"""What a tool call returns. A success is the tool's JSON object, as ``structuredContent`` and as its JSON text.
An error is ``isError: true`` carrying the API's own error body, ``{"error": message, "code": code, "details":
{...}}`` with the stable codes of :mod:`cryobox.errors` (``not_found``, ``quota_exceeded``, ``invalid_argument``
…), both as ``structuredContent`` and as its JSON text. The caller's API key never appears in either: every
string is scrubbed of it before it leaves (a command could echo it, an error message could quote it)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from mcp import types
from pydantic import ValidationError

from ..errors import CryoboxError, InvalidArgument

log = logging.getLogger(__name__)

REDACTED = "[redacted]"


def redact(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` (JSON-like) with every occurrence of a non-empty secret in its strings replaced."""
    hidden = [s for s in secrets if s]
    if not hidden:
        return value
    if isinstance(value, str):
        for secret in hidden:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {redact(k, hidden): redact(v, hidden) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, hidden) for v in value]
    return value


def _result(body: dict[str, Any], *, is_error: bool, secrets: Sequence[str]) -> types.CallToolResult:
    clean: dict[str, Any] = redact(body, secrets)
    text = json.dumps(clean, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=clean, isError=is_error
    )


def success(body: dict[str, Any], secrets: Sequence[str] = ()) -> types.CallToolResult:
    return _result(json.loads(json.dumps(body, default=str)), is_error=False, secrets=secrets)


def invalid_arguments(tool: str, err: ValidationError) -> InvalidArgument:
    """The :class:`InvalidArgument` of arguments that failed their model (the offending values are not quoted)."""
    problems = [
        {"field": ".".join(str(p) for p in e["loc"]) or "(arguments)", "problem": e["msg"]} for e in err.errors()
    ]
    summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
    return InvalidArgument(f"invalid arguments for {tool}: {summary}", details={"tool": tool, "errors": problems})


def failure(err: BaseException, secrets: Sequence[str] = ()) -> types.CallToolResult:
    """The tool error of ``err``: a :class:`CryoboxError` keeps its code, message and details; anything else is
    ``internal`` without its text (logged here instead)."""
    if not isinstance(err, CryoboxError):
        log.error("MCP tool failed unexpectedly", exc_info=err)
        err = CryoboxError(f"internal error ({type(err).__name__})")
    return _result(err.to_wire(), is_error=True, secrets=secrets)
