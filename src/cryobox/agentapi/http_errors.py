"""The agent HTTP API's error answers: ``{"error", "code", "details"}`` with the code's status (``Retry-After`` for
``HostUnavailable``/``QuotaExceeded``); a request that does not validate is ``400 invalid_argument`` listing its
problems under ``details.errors`` (each ``{"loc", "msg"}``). Shared by the FastAPI routes (:mod:`.http_server`)
and the plain ones (:mod:`.http_fast`), so that both answer alike."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..errors import CryoboxError, HostUnavailable, QuotaExceeded

log = logging.getLogger(__name__)


def error_response(
    status: int, message: str, code: str, details: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message or code, "code": code, "details": details or {}}, status, headers)


def cryobox_error_response(exc: CryoboxError) -> JSONResponse:
    headers = None
    if isinstance(exc, HostUnavailable | QuotaExceeded):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    status = exc.http_status if exc.http_status >= 400 else 500
    if status == 500:
        log.error("agent call failed: %s", exc, exc_info=exc)
    return error_response(status, exc.message, exc.code, exc.details, headers)


def invalid_response(problems: list[dict[str, Any]]) -> JSONResponse:
    """``400 invalid_argument`` naming the first of ``problems`` (``{"loc": [...], "msg": ...}``)."""
    first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
    message = f"invalid request: {'.'.join(first['loc'])}: {first['msg']}"
    return error_response(400, message, "invalid_argument", {"errors": problems})


def validation_response(exc: RequestValidationError) -> JSONResponse:
    return invalid_response(
        [{"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))} for err in exc.errors()]
    )


__all__ = ["cryobox_error_response", "error_response", "invalid_response", "validation_response"]
