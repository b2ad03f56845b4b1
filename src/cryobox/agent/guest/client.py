"""Host side of the guest-agent protocol (see :mod:`cryobox.guest.protocol`) over the VM's unix socket.

One reader task routes replies by request id, so any number of calls and streams share one connection.
If the connection drops, every pending call fails with :class:`GuestError` (never hangs).

The guest is hostile, so what it can make the host hold is bounded:

- a frame may be at most as large as the largest reply a pending request allows (``max_reply``: 1 MiB
  unless the call asks for more, e.g. a file read); a longer header is a protocol violation, caught before
  its body is read;
- each request's queue holds at most :data:`QUEUE_FRAMES` frames: when a consumer is slow (an HTTP client
  not reading an exec stream) the reader stops reading the socket, so the guest blocks, not the host;
- frames above :data:`OFFLOAD_BYTES` are decoded on a thread, never on the event loop;
- a violation (oversized or undecodable frame) ends the connection and calls ``on_violation``, which kills
  the VM (:meth:`~cryobox.agent.vm.MicroVM.connect_guest`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ...errors import CryoboxError, GuestError, InvalidArgument, NotFound, StateError
from ...guest import protocol

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
SMALL_REPLY = 1 << 20
"""What a call's reply (and a stream's event) may weigh unless the caller allows more."""
STREAM_EVENT = 2 << 20
"""A stream event: a 1 MiB output chunk, base64-encoded, in JSON."""
QUEUE_FRAMES = 8
READ_BUFFER = 256 << 10
OFFLOAD_BYTES = 256 << 10
LISTING_REPLY = 16 << 20
"""A directory listing or stat result."""
EXEC_REPLY = 48 << 20
"""A collected exec result: two 16 MiB output captures, base64-encoded, in JSON."""
FILE_REPLY = protocol.MAX_FRAME
"""A 64 MiB file, base64-encoded, in JSON."""


class GuestClient:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        name: str = "",
        on_violation: Callable[[str], None] | None = None,
    ) -> None:
        self._reader = reader
        self._on_violation = on_violation
        self._limits: dict[int, int] = {}
        self.violation: str | None = None
        self._writer = writer
        self._ids = itertools.count(1)
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._posted: set[asyncio.Task[None]] = set()
        self._log = log.getChild(name) if name else log
        self._task = asyncio.create_task(self._read_loop(), name=f"guest-reader-{name}")

    @classmethod
    async def connect(
        cls, path: Path, name: str = "", on_violation: Callable[[str], None] | None = None
    ) -> GuestClient:
        # the limit bounds what the transport buffers while nobody reads (2x): readexactly() of a larger frame
        # still works (it resumes reading as it needs data), but a stalled reader stops the socket at 512 KiB
        reader, writer = await asyncio.open_unix_connection(str(path), limit=READ_BUFFER)
        return cls(reader, writer, name, on_violation)

    @property
    def closed(self) -> bool:
        return self._closed

    def _allowed(self) -> int:
        return max(self._limits.values(), default=SMALL_REPLY)

    async def _read_loop(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(protocol.HEADER.size)
                length = protocol.decode_length(header)
                if length > self._allowed():
                    raise protocol.FrameError(f"frame of {length} bytes; at most {self._allowed()} expected")
                body = await self._reader.readexactly(length)
                if length > OFFLOAD_BYTES:
                    message = await asyncio.to_thread(protocol.decode_body, body)
                else:
                    message = protocol.decode_body(body)
                del body
                if not isinstance(message, dict):
                    raise protocol.FrameError("a frame that is not a JSON object")
                request_id = message.get("id", -1)
                queue = self._queues.get(request_id)
                if queue is None:
                    continue
                if "event" in message and length > STREAM_EVENT:
                    raise protocol.FrameError(f"stream event of {length} bytes")
                await queue.put(message)  # a full queue stops the reading here: backpressure onto the guest
        except protocol.FrameError as err:
            self.violation = str(err)
            self._log.warning("guest broke the protocol: %s", err)
            if self._on_violation is not None:
                self._on_violation(str(err))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError) as err:
            self._log.debug("guest connection ended: %r", err)
        finally:
            self._closed = True
            self._writer.close()
            for queue in self._queues.values():
                while queue.full():  # make room for the wake-up: the consumer is told the guest is gone
                    queue.get_nowait()
                queue.put_nowait(_CLOSED)

    async def _send(
        self, op: str, args: dict[str, Any], max_reply: int = SMALL_REPLY
    ) -> tuple[int, asyncio.Queue[Any]]:
        if self._closed:
            raise GuestError(f"guest agent connection is closed{f' ({self.violation})' if self.violation else ''}")
        request_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=QUEUE_FRAMES)
        self._queues[request_id] = queue
        self._limits[request_id] = min(max_reply, protocol.MAX_FRAME)
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

    async def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None, max_reply: int = SMALL_REPLY
    ) -> dict[str, Any]:
        """Send ``op`` and wait for its reply (which may weigh up to ``max_reply`` bytes on the wire)."""
        request_id, queue = await self._send(op, args or {}, max_reply)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await queue.get()
                    if message is _CLOSED or "event" not in message:
                        return self._final(op, message)
        except TimeoutError:
            raise GuestError(f"guest agent did not answer {op} within {timeout}s", details={"op": op}) from None
        finally:
            self._forget(request_id)

    async def post(self, op: str, args: dict[str, Any], timeout: float) -> None:
        """Send ``op`` now and return without waiting for its reply, which is checked in the background (a failure
        or no answer within ``timeout`` is logged). For an inline op (answered on the guest's reader thread in
        the order sent: :data:`cryobox.guest.agent.INLINE_OPS`) every request sent after this one is read by the
        guest after it took effect."""
        request_id, queue = await self._send(op, args)

        async def reply() -> None:
            try:
                async with asyncio.timeout(timeout):
                    message = await queue.get()
                self._final(op, message)
            except TimeoutError:
                self._log.warning("guest agent did not answer %s within %ss", op, timeout)
            except CryoboxError as err:
                self._log.warning("guest %s failed: %s", op, err)
            finally:
                self._forget(request_id)

        task = asyncio.create_task(reply(), name=f"guest-{op}-{request_id}")
        self._posted.add(task)
        task.add_done_callback(self._posted.discard)

    async def stream(self, op: str, args: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yield event messages, then one final ``{"event": "result", "result": {...}}``.

        A consumer that stops early (closes the generator, or is cancelled) before the final reply arrived makes
        the guest cancel the request (a ``cancel`` frame, not waited for): streams that run until cancelled end,
        an attached process detaches and runs on.
        """
        request_id, queue = await self._send(op, args, STREAM_EVENT)
        finished = False
        try:
            while True:
                message = await queue.get()
                if message is not _CLOSED and "event" in message:
                    yield message
                    continue
                finished = True
                yield {"event": "result", "result": self._final(op, message)}
                return
        finally:
            self._forget(request_id)
            if not finished:
                self._cancel_nowait(request_id)

    def _cancel_nowait(self, request_id: int) -> None:
        """Ask the guest to cancel ``request_id``; its reply is dropped by the reader (no queue for it). Never
        raises and never waits: the frame goes into the transport's buffer whole, so it cannot split another
        request's frame."""
        if self._closed or self._writer.is_closing():
            return
        try:
            frame = protocol.encode({"id": next(self._ids), "op": "cancel", "args": {"request": request_id}})
            self._writer.write(frame)
        except Exception as err:  # the connection broke meanwhile: nothing left to cancel
            self._log.debug("cannot send cancel for request %s: %r", request_id, err)

    async def ping(self, timeout: float = 1.0) -> dict[str, Any]:
        """:raises TimeoutError: no answer within ``timeout`` (callers retry pings)."""
        request_id, queue = await self._send("ping", {})
        try:
            async with asyncio.timeout(timeout):
                return self._final("ping", await queue.get())
        finally:
            self._forget(request_id)

    def _forget(self, request_id: int) -> None:
        self._limits.pop(request_id, None)
        queue = self._queues.pop(request_id, None)
        while queue is not None and not queue.empty():  # unblock a reader waiting to put into it
            queue.get_nowait()

    async def aclose(self) -> None:
        self._closed = True
        for posted in list(self._posted):
            posted.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
