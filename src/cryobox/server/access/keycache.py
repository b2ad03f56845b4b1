"""A short-lived cache of API key -> workspace, so a request costs no registry round trip for its key.

Keyed by the key's sha256 (the plaintext is never kept). A revoked key stops working within ``ttl_s``
(default 5 s) on every replica; unknown keys are cached too (briefly), so a flood of bad keys does not become
a flood of queries.

:meth:`KeyCache.check` answers a hit on the event loop and takes a thread only for a lookup: every request's key
is checked twice (the gate, then the route), and a thread hop each was ~0.1 ms quiet and far more when a restart's
adoption kept the executor busy (the first request after one waited 27 ms for its gate's).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ...registry import WorkspaceInfo

DEFAULT_TTL_S = 5.0
MAX_ENTRIES = 4096


class KeyCache:
    def __init__(
        self,
        lookup: Callable[[str], WorkspaceInfo | None],
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, WorkspaceInfo | None]] = OrderedDict()
        self._lookups: dict[str, asyncio.Future[WorkspaceInfo | None]] = {}

    def cached(self, key: str) -> tuple[bool, WorkspaceInfo | None]:
        """``(True, answer)`` when a fresh answer for ``key`` is cached, else ``(False, None)``: never a lookup."""
        return self._cached(_digest(key))

    def _cached(self, digest: str) -> tuple[bool, WorkspaceInfo | None]:
        now = self._clock()
        with self._lock:
            hit = self._entries.get(digest)
            if hit is not None and hit[0] > now:
                self._entries.move_to_end(digest)
                return True, hit[1]
        return False, None

    async def check(self, key: str) -> WorkspaceInfo | None:
        """:meth:`authenticate` from the event loop: a hit answered at once, a lookup on a thread, shared by the
        requests that miss on the same key meanwhile (the first requests after a start all miss at once)."""
        digest = _digest(key)
        hit, workspace = self._cached(digest)
        if hit:
            return workspace
        lookup = self._lookups.get(digest)
        if lookup is None:
            lookup = self._lookups[digest] = asyncio.ensure_future(asyncio.to_thread(self.authenticate, key))
            lookup.add_done_callback(lambda _: self._lookups.pop(digest, None))
        return await asyncio.shield(lookup)  # a caller that gives up does not cancel the others' lookup

    def authenticate(self, key: str) -> WorkspaceInfo | None:
        digest = _digest(key)
        hit, found = self._cached(digest)
        if hit:
            return found
        now = self._clock()
        workspace = self._lookup(key)
        with self._lock:
            self._entries[digest] = (now + self._ttl_s, workspace)
            self._entries.move_to_end(digest)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)
        return workspace


def _digest(key: str) -> str:
    """What a key is kept under (never its plaintext)."""
    return hashlib.sha256(key.encode()).hexdigest()
