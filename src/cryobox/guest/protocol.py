"""Wire protocol between the host and the guest agent (stdlib only; runs on both sides).

Frames are a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.

Requests (host -> guest)::

    {"id": 7, "op": "exec", "args": {...}}

Replies (guest -> host). Every request gets exactly one final reply, optionally preceded by events::

    {"id": 7, "event": "stdout", "data": "<base64>"}      # only for ops that stream
    {"id": 7, "ok": true, "result": {...}}                # final, success
    {"id": 7, "ok": false, "error": {"code": "...", "message": "..."}}   # final, failure

Binary payloads (file contents, output chunks) travel base64-encoded in ``data``/``content`` fields.
Error codes are stable strings: ``not_found``, ``is_a_directory``, ``not_a_directory``, ``permission_denied``,
``invalid_argument``, ``timeout``, ``exists``, ``internal``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 128 * 1024 * 1024  # 64 MiB file, base64-encoded, plus slack
PORT_NAME = "cryobox.agent"


class FrameError(Exception):
    """The peer sent something that is not a valid frame."""


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def decode_length(header: bytes) -> int:
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return int(length)


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except ValueError as err:
        raise FrameError(f"frame is not JSON: {err}") from err
    if not isinstance(message, dict):
        raise FrameError("frame is not a JSON object")
    return message
