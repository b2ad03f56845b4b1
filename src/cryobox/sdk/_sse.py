"""Server-sent events of ``POST /v1/sandboxes/{id}/exec/stream``: decoding, and mapping to stream events.

IO-free like :mod:`._base`; both clients feed it the lines they read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ERRORS_BY_CODE, CryoboxError, GuestError
from ._base import StreamEvent, StreamKind, _build_error

# --- exec streams (server-sent events) -------------------------------------------------------------------------

STREAM_ENDED_EARLY = "exec stream ended before the command reported an exit code"


@dataclass(frozen=True)
class SSEMessage:
    event: str
    data: str


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder: feed it lines (without their terminators)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SSEMessage | None:
        """Returns a message when ``line`` completes one (a blank line), else ``None``."""
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> SSEMessage | None:
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        if not data:
            return None
        return SSEMessage(event=event, data="\n".join(data))


def stream_error(data: Mapping[str, Any]) -> CryoboxError:
    """The error an ``event: error`` stands for: its ``code`` through the error table (default CryoboxError)."""
    message = data.get("error")
    if not isinstance(message, str) or not message:
        message = "exec stream reported an error"
    details = data.get("details")
    cls = ERRORS_BY_CODE.get(str(data.get("code") or ""), CryoboxError)
    return _build_error(cls, message, details if isinstance(details, dict) else {}, None)


def decode_stream_message(message: SSEMessage) -> StreamEvent | None:
    """One SSE message of an exec stream as a :class:`StreamEvent` (``None`` for events we do not know).

    :raises CryoboxError: an ``error`` event (mapped by its ``code``), or malformed data.
    """
    if message.event not in ("stdout", "stderr", "exit", "error"):
        return None
    try:
        data = json.loads(message.data)
    except ValueError as err:
        raise GuestError(f"malformed exec stream data for {message.event!r}: {message.data[:200]!r}") from err
    if not isinstance(data, dict):
        raise GuestError(f"malformed exec stream data for {message.event!r}: {message.data[:200]!r}")
    if message.event == "error":
        raise stream_error(data)
    if message.event == "exit":
        exit_code = data.get("exit_code")
        if isinstance(exit_code, bool) or not isinstance(exit_code, int):
            raise GuestError(f"exec stream exit event without an integer exit_code: {message.data[:200]!r}")
        return StreamEvent(kind="exit", exit_code=exit_code)
    kind: StreamKind = "stdout" if message.event == "stdout" else "stderr"
    chunk = data.get("chunk", "")
    return StreamEvent(kind=kind, chunk=chunk if isinstance(chunk, str) else str(chunk))


class ExecStreamDecoder:
    """Lines of an exec stream in, :class:`StreamEvent` out. Feed ``""`` at end of stream to flush."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()

    def feed(self, line: str) -> StreamEvent | None:
        """:raises CryoboxError: the line completed an ``error`` event or malformed data."""
        message = self._sse.feed(line)
        return decode_stream_message(message) if message is not None else None


OutputCallback = Callable[[str], object]


def notify(event: StreamEvent, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None) -> None:
    """Hand an output chunk to the matching callback, if any."""
    if event.kind == "stdout" and on_stdout is not None:
        on_stdout(event.chunk)
    elif event.kind == "stderr" and on_stderr is not None:
        on_stderr(event.chunk)


def stream_ended_early() -> GuestError:
    return GuestError(STREAM_ENDED_EARLY)
