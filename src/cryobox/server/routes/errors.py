"""The HTTP boundary for errors: every failure leaves as ``{"error", "code", "details"}``."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import CryoboxError, HostUnavailable, QuotaExceeded
from ...models import ErrorBody

log = logging.getLogger(__name__)

_DESCRIPTIONS = {
    400: "invalid input; nothing changed",
    401: "missing or invalid API key (or console session)",
    403: ("not allowed (forbidden; nothing changed), or a console-session write without its X-CSRF-Token (csrf)"),
    404: "unknown id (or another workspace's)",
    409: "wrong state for this operation",
    413: "request too large",
    424: "a resume hook of the guest failed after a restore, resume or wake (details.failed_hooks)",
    429: (
        "rate limited (rate_limited: retry after Retry-After seconds), or a workspace quota reached (quota_exceeded: "
        "details resource, limit, used, requested; nothing was created)"
    ),
    502: (
        "an upstream failed: the sandbox's guest (guest_error), a port in it (port_unreachable), an image registry "
        "(image_pull_failed) or the object store (store_error)"
    ),
    503: "no capacity; nothing was created; retry after Retry-After seconds",
    504: "the command timed out (process group killed)",
}
ERROR_SCHEMA = "ErrorBody"
# Documented on every route so the OpenAPI document states what clients can get back. By reference, not as
# ``{"model": ErrorBody}``: FastAPI builds a pydantic field per documented model, per route, in every app at the
# first request a router matches, and these ten were three quarters of a router's build (the sandboxes router: 119
# fields, ~27 ms quiet, ~180 ms in a loaded restart's first request). ``document_errors`` adds the schema itself.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR_SCHEMA}"}}},
    }
    for status, text in _DESCRIPTIONS.items()
}


def document_errors(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document define the error body the routes' responses refer to."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.setdefault(ERROR_SCHEMA, ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}"))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


_STATUS_CODES = {
    400: "invalid_argument",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "wrong_state",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_response(
    status: int,
    message: str,
    code: str,
    details: dict[str, object] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": message or code, "code": code, "details": details or {}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    document_errors(app)

    @app.exception_handler(CryoboxError)
    async def cryobox_error(_: Request, exc: CryoboxError) -> JSONResponse:
        headers = None
        if isinstance(exc, HostUnavailable | QuotaExceeded):
            retry = getattr(exc, "retry_after_s", 1.0)
            headers = {"Retry-After": str(max(1, math.ceil(retry)))}
        if exc.http_status >= 500:
            log.error("request failed: %s", exc, exc_info=exc.http_status == 500)
        return error_response(exc.http_status, exc.message, exc.code, exc.details, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", "")).removeprefix("Value error, ")}
            for err in exc.errors()
        ]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        message = f"invalid request: {'.'.join(first['loc'])}: {first['msg']}"
        return error_response(400, message, "invalid_argument", {"errors": problems})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, str(exc.detail), code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal")
