"""The parent's side of a kernel process's three pipes: its messages (JSON lines) and its stdout and stderr.

Output is always drained before a message is handed on (the kernel flushes both streams before it writes a
message), so what a cell printed comes before the result or error that followed it. Text is decoded
incrementally, so a character split across two reads comes out whole.
"""

from __future__ import annotations

import codecs
import json
import os
import selectors
import time
from collections.abc import Callable
from typing import Any

CHUNK = 64 * 1024
LINE_WAIT_S = 0.005
OnOutput = Callable[[str, str], None]


class Pipes:
    def __init__(self, events_fd: int, stdout_fd: int, stderr_fd: int) -> None:
        self._events_fd = events_fd
        self._names = {stdout_fd: "stdout", stderr_fd: "stderr"}
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")(errors="replace") for fd in self._names}
        for fd in (events_fd, *self._names):
            os.set_blocking(fd, False)
        self._selector = selectors.DefaultSelector()
        for fd in (events_fd, *self._names):
            self._selector.register(fd, selectors.EVENT_READ)
        self._buffer = b""
        self._lines: list[bytes] = []
        self.closed = False

    def output(self) -> list[tuple[str, str]]:
        """Whatever the kernel printed that is there now; a chunk that stops mid-line waits up to
        :data:`LINE_WAIT_S` once for the rest of it (``print`` writes the text and the newline separately)."""
        out = self._read_output()
        if out and not out[-1][1].endswith("\n"):
            time.sleep(LINE_WAIT_S)
            for name, text in self._read_output():
                if out[-1][0] == name:
                    out[-1] = (name, out[-1][1] + text)
                else:
                    out.append((name, text))
        return out

    def _read_output(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for fd, name in list(self._names.items()):
            while True:
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    self._forget(fd)
                    break
                text = self._decoders[fd].decode(data)
                if text and out and out[-1][0] == name:
                    out[-1] = (name, out[-1][1] + text)  # one chunk per stream per look
                elif text:
                    out.append((name, text))
        return out

    def _forget(self, fd: int) -> None:
        if fd in self._names:
            del self._names[fd]
            self._selector.unregister(fd)

    def next_event(self, timeout_s: float, on_output: OnOutput | None = None) -> dict[str, Any] | None:
        """The next message, waiting up to ``timeout_s``; output read meanwhile goes to ``on_output`` (dropped
        without one). ``None`` on timeout, or when the message pipe closed (:attr:`closed`)."""
        deadline = time.monotonic() + timeout_s
        while not self._lines:
            if self.closed:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            for key, _ in self._selector.select(remaining):
                if key.fd == self._events_fd:
                    self._read_events()
                else:
                    for name, text in self.output():
                        if on_output is not None:
                            on_output(name, text)
        for name, text in self.output():  # what was printed before the message comes first
            if on_output is not None:
                on_output(name, text)
        line = self._lines.pop(0)
        try:
            message = json.loads(line)
        except ValueError:
            return {"type": "noise", "text": line.decode(errors="replace")}
        return message if isinstance(message, dict) else {"type": "noise"}

    def _read_events(self) -> None:
        try:
            data = os.read(self._events_fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            self._selector.unregister(self._events_fd)
            return
        self._buffer += data
        *complete, self._buffer = self._buffer.split(b"\n")
        self._lines.extend(line for line in complete if line.strip())

    def close(self) -> None:
        self._selector.close()
        if not self.closed:
            self.closed = True
        os.close(self._events_fd)
