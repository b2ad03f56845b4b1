"""Base64 for bytes that cross JSON (the guest protocol, the agent interface, terminals)."""

from __future__ import annotations

import base64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(data: str | None) -> bytes:
    """The bytes of ``data``; ``None`` or ``""`` are no bytes."""
    return base64.b64decode(data) if data else b""
