"""Single-use tickets for the terminal websocket: a browser cannot set an ``Authorization`` header on a
websocket, and a key in the query string ends up in access logs. ``POST /v1/sandboxes/{id}/pty/tickets``
(authenticated) returns a ticket valid for one connection to that sandbox's terminal within ``ttl_s``."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TICKET_TTL_S = 30.0
MAX_OUTSTANDING = 10_000


@dataclass
class PtyTickets:
    ttl_s: float = TICKET_TTL_S
    clock: Callable[[], float] = time.monotonic
    _open: dict[str, tuple[str, str, float]] = field(default_factory=dict)

    def issue(self, workspace_id: str, sandbox_id: str) -> str:
        self._sweep()
        ticket = "pty_" + secrets.token_urlsafe(24)
        self._open[ticket] = (workspace_id, sandbox_id, self.clock() + self.ttl_s)
        return ticket

    def redeem(self, ticket: str, sandbox_id: str) -> str | None:
        """The workspace the ticket was issued to, if it is valid for ``sandbox_id`` (it is used up either way)."""
        found = self._open.pop(ticket, None)
        if found is None:
            return None
        workspace_id, issued_for, expires = found
        if issued_for != sandbox_id or self.clock() > expires:
            return None
        return workspace_id

    def _sweep(self) -> None:
        now = self.clock()
        if len(self._open) >= MAX_OUTSTANDING or len(self._open) % 256 == 0:
            for ticket in [t for t, (_, _, expires) in self._open.items() if expires < now]:
                del self._open[ticket]
        while len(self._open) >= MAX_OUTSTANDING:  # the oldest go first (dicts keep insertion order)
            del self._open[next(iter(self._open))]
