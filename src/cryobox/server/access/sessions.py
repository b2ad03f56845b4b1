"""Console sessions: an API key exchanged once for an opaque cookie, multi-replica safe.

The cookie carries 32 random bytes and nothing else (never the key, never a workspace). The registry stores
only the token's SHA-256, bound to the API key's row, with a sliding expiry (default 12 h) and the time a
logout ended it (:class:`~cryobox.registry.sessions.SessionRecords`). Every replica behind a load balancer
reads the same rows, so a login on one works on all, a logout on one ends it everywhere, and revoking the key
ends its sessions. Lookups are cached for ``cache_s`` (5 s, like the key cache), so a revoked key or a logout
seen through another replica takes effect within that; a logout through this replica takes effect at once.

The CSRF token is an HMAC of the session token (a one-way derivation: it reveals nothing about the cookie), so
nothing else needs storing and every replica computes the same value.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ...registry.sessions import SessionInfo, SessionRecords

COOKIE_NAME = "cryobox_session"
CSRF_HEADER = "x-csrf-token"
DEFAULT_TTL_S = 12 * 3600.0
DEFAULT_CACHE_S = 5.0
EXTEND_AFTER_S = 300.0
"""A session's expiry slides forward at most this often (one registry write per 5 minutes of use, not per
request)."""
MAX_CACHED = 4096
PURGE_AFTER_S = 86400.0
PURGE_EVERY_S = 3600.0


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_for(token: str) -> str:
    return hmac.new(token.encode(), b"cryobox-console-csrf", hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Login:
    token: str
    """The cookie's value (shown to the browser once, in ``Set-Cookie``; never logged)."""
    session: SessionInfo

    @property
    def csrf_token(self) -> str:
        return csrf_for(self.token)


class ConsoleSessions:
    def __init__(
        self,
        records: SessionRecords,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        cache_s: float = DEFAULT_CACHE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self.ttl_s = ttl_s
        self._cache_s = cache_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[float, SessionInfo | None]] = OrderedDict()

    def login(self, api_key: str) -> Login | None:
        """A new session for a valid key, or ``None``. Blocking (registry I/O): call from a thread."""
        token = secrets.token_urlsafe(32)
        session = self._records.open(api_key, token_hash(token), self._clock() + self.ttl_s)
        return None if session is None else Login(token, session)

    def authenticate(self, token: str) -> SessionInfo | None:
        """The live session of a cookie's token, or ``None``. Blocking on a cache miss: call from a thread."""
        if not token:
            return None
        digest = token_hash(token)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None and hit[0] > now:
                session = hit[1]
                if session is None or session.expires_at > now:
                    return session
        session = self._records.lookup(digest, now)
        if session is not None and session.expires_at - now < self.ttl_s - EXTEND_AFTER_S:
            expires_at = now + self.ttl_s
            self._records.extend(digest, expires_at)
            session = SessionInfo(session.workspace, session.key_id, expires_at)
        with self._lock:
            self._cache[digest] = (now + self._cache_s, session)
            self._cache.move_to_end(digest)
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return session

    def logout(self, token: str) -> None:
        """End the session everywhere (blocking: call from a thread)."""
        digest = token_hash(token)
        with self._lock:
            self._cache.pop(digest, None)
        self._records.end(digest, self._clock())

    def purge(self, older_than_s: float = PURGE_AFTER_S) -> int:
        """Forget sessions that expired or ended more than ``older_than_s`` ago (blocking: call from a thread)."""
        return self._records.purge(self._clock() - older_than_s)

    @staticmethod
    def csrf_ok(token: str, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(csrf_for(token).encode(), presented.strip().encode())
