"""uvicorn's HTTP/1.1 protocol (httptools) with a graceful stop that drops no request it accepted.

httptools rather than h11: the agent's answer to each of the control plane's calls is parsed and written here, and
h11's pure-Python state machine was ~0.07 ms of the agent's 0.16 ms of CPU per call on a warm core (a stub agent on
loopback; several times that right after a guest ran), part of the hop every fleet create and exec pays.

uvicorn's ``shutdown`` closes every connection without a request in progress at once. A connection accepted a
moment before the stop whose request has not been read yet counts as one of them: its client sees "Server
disconnected without sending a response", a request failed by an upgrade or a restart (found by
``tests/integration/compose/test_upgrade.py``: one of 152 execs, each on a new connection). Here such a
connection gets :data:`IDLE_GRACE_S` to send its request, which is served and then closes the connection
(``keep_alive`` off); one that sends nothing in that time is closed as before. A request already in the socket's
receive buffer (``FIONREAD``) is waited for however long the loop takes to read it (up to a second). The grace
counts from the connection's last answer: a client that has left it idle for longer is not about to send on it, and
its connection is closed at once instead of holding the stop (and so a restart's window) for 0.25 s; the clients the
grace is for, sending again right after an answer, still get all of it. A connection not answered yet since its
accept is a client about to send its first request, however slow it is (a loaded host): it gets up to
:data:`PENDING_GRACE_S` counted from its accept (a full suite's restart test reset one exec of 68 when this was the
idle grace); one accepted longer ago that has still sent nothing (a browser's speculative connection) is not about
to, and is closed at once. The timer re-reads the receive buffer before it closes, so a request that arrived
meanwhile is read instead of reset.
"""

from __future__ import annotations

import asyncio
import fcntl
import sys
import termios

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

IDLE_GRACE_S = 0.25
"""How long a stopping server waits for the request of an idle connection with nothing in its receive buffer (50 ms
was tried: under load a keep-alive client's next request then met the close, one ReadError per few upgrades)."""
PENDING_GRACE_S = 1.0
"""How long it waits for the loop to read a request already in the receive buffer, or (from its accept) for the first
request of a connection it has not answered yet."""


class DrainingProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` whose :meth:`shutdown` lets an idle connection's arriving request through."""

    draining = False
    _grace: asyncio.TimerHandle | None = None
    _idle_since: float | None = None
    _accepted_at = 0.0
    _extended = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._accepted_at = self.loop.time()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_since = self.loop.time()

    def shutdown(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.draining = True
            if self._grace is None:
                now = self.loop.time()
                if _pending(self.transport):
                    grace = PENDING_GRACE_S
                elif self._idle_since is None:  # not answered yet: its first request is on its way
                    grace = max(0.0, PENDING_GRACE_S - (now - self._accepted_at))
                else:
                    grace = max(0.0, IDLE_GRACE_S - (now - self._idle_since))
                self._grace = self.loop.call_later(grace, self._close_if_idle)
        else:
            self.cycle.keep_alive = False

    def _close_if_idle(self) -> None:
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        if _pending(self.transport) and not self._extended:
            # arrived since: the loop reads it next (its answer then closes the connection)
            self._extended = True
            self._grace = self.loop.call_later(PENDING_GRACE_S, self._close_if_idle)
            return
        super().shutdown()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.draining and self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # the request that arrived while stopping: answered, then closed

    def connection_lost(self, exc: Exception | None) -> None:
        if self._grace is not None:
            self._grace.cancel()
        super().connection_lost(exc)


def _pending(transport: asyncio.BaseTransport) -> bool:
    """Whether the connection's socket holds bytes not read yet (a request the loop has not got to)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        buffered = bytearray(4)
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, buffered)
    except OSError:
        return False
    return int.from_bytes(buffered, sys.byteorder) > 0
