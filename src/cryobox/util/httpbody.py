"""Reading a request's body with a cap: refused as soon as it (declared or received) passes the limit."""

from __future__ import annotations

from starlette.requests import Request

from ..errors import PayloadTooLarge


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


__all__ = ["read_body"]
