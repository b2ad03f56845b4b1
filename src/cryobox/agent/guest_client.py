"""Host side of the guest-agent protocol (see :mod:`cryobox.guest.protocol`) over the VM's unix socket.

One reader task routes replies by request id, so any number of calls and streams share one connection.
If the connection drops, every pending call fails with :class:`GuestError` (never hangs).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..errors import GuestError, InvalidArgument, NotFound, StateError
from ..guest import protocol

log = logging.getLogger(__name__)

# guest error code -> host exception class (the one translation boundary for guest failures)
GUEST_ERRORS: dict[str, type[GuestError] | type[NotFound] | type[InvalidArgument] | type[StateError]] = {
    "not_found": NotFound,
    "invalid_argument": InvalidArgument,
    "is_a_directory": InvalidArgument,
    "not_a_directory": InvalidArgument,
    "exists": InvalidArgument,
    "permission_denied": InvalidArgument,
}

_CLOSED = object()


class GuestClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str = "") -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._log = log.getChild(name) if name else log
        self._task = asyncio.create_task(self._read_loop(), name=f"guest-reader-{name}")

    @classmethod
    async def connect(cls, path: Path, name: str = "") -> GuestClient:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=protocol.MAX_FRAME)
        return cls(reader, writer, name)

    @property
    def closed(self) -> bool:
        return self._closed

    async def _read_loop(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(protocol.HEADER.size)
                body = await self._reader.readexactly(protocol.decode_length(header))
                message = protocol.decode_body(body)
                queue = self._queues.get(message.get("id", -1))
                if queue is not None:
                    queue.put_nowait(message)
        except (asyncio.IncompleteReadError, ConnectionError, protocol.FrameError, OSError) as err:
            self._log.debug("guest connection ended: %r", err)
        finally:
            self._closed = True
            for queue in self._queues.values():
                queue.put_nowait(_CLOSED)

    async def _send(self, op: str, args: dict[str, Any]) -> tuple[int, asyncio.Queue[Any]]:
        if self._closed:
            raise GuestError("guest agent connection is closed")
        request_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = queue
        frame = protocol.encode({"id": request_id, "op": op, "args": args})
        async with self._write_lock:
            self._writer.write(frame)
            await self._writer.drain()
        return request_id, queue

    @staticmethod
    def _final(op: str, message: Any) -> dict[str, Any]:
        if message is _CLOSED:
            raise GuestError(f"guest agent went away during {op}")
        if message.get("ok"):
            result: dict[str, Any] = message.get("result") or {}
            return result
        error = message.get("error") or {}
        cls = GUEST_ERRORS.get(error.get("code", ""), GuestError)
        raise cls(str(error.get("message") or f"guest {op} failed"), details={"guest_code": error.get("code")})

    async def call(self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
        request_id, queue = await self._send(op, args or {})
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await queue.get()
                    if message is _CLOSED or "event" not in message:
                        return self._final(op, message)
        except TimeoutError:
            raise GuestError(f"guest agent did not answer {op} within {timeout}s", details={"op": op}) from None
        finally:
            self._queues.pop(request_id, None)

    async def stream(self, op: str, args: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yield event messages, then one final ``{"event": "result", "result": {...}}``."""
        request_id, queue = await self._send(op, args)
        try:
            while True:
                message = await queue.get()
                if message is not _CLOSED and "event" in message:
                    yield message
                    continue
                yield {"event": "result", "result": self._final(op, message)}
                return
        finally:
            self._queues.pop(request_id, None)

    async def ping(self, timeout: float = 1.0) -> dict[str, Any]:
        """:raises TimeoutError: no answer within ``timeout`` (callers retry pings)."""
        request_id, queue = await self._send("ping", {})
        try:
            async with asyncio.timeout(timeout):
                return self._final("ping", await queue.get())
        finally:
            self._queues.pop(request_id, None)

    async def aclose(self) -> None:
        self._closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""
