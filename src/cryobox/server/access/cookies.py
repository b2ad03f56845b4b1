"""Which requests a console session cookie may authenticate, and the one check of it (used by the API's front
gate, before any body is read, and again by the routes' auth dependency).

A cookie counts only on ``/v1/*``, ``/ui/api/*`` and ``/ui/session``, only when no API key is presented (a key
wins), and a request that is not GET/HEAD/OPTIONS must carry the session's ``X-CSRF-Token`` (the browser sends
the cookie on its own; only the page that logged in knows the token). ``SameSite=Strict`` is the first line of
that defence, the token the second.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import cookie_parser

from ...errors import CsrfRefused, Unauthorized
from ...registry.sessions import SessionInfo
from .sessions import COOKIE_NAME, CSRF_HEADER, ConsoleSessions

UI_PREFIX = "/ui"
COOKIE_PREFIXES = ("/v1/", "/ui/api/")
SESSION_PATH = "/ui/session"
LOGIN_PATH = "/ui/login"
LOGOUT_PATH = "/ui/logout"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_console_asset(path: str) -> bool:
    """The single-page app's files (public: they hold no data)."""
    if path == UI_PREFIX or path == UI_PREFIX + "/":
        return True
    if not path.startswith(UI_PREFIX + "/"):
        return False
    return not (path.startswith("/ui/api/") or path in (SESSION_PATH, LOGIN_PATH, LOGOUT_PATH))


def cookie_allowed(path: str) -> bool:
    return path.startswith(COOKIE_PREFIXES) or path == SESSION_PATH


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def session_token(cookie_header: str | None) -> str | None:
    if not cookie_header:
        return None
    return cookie_parser(cookie_header).get(COOKIE_NAME) or None


def check_session(sessions: ConsoleSessions, token: str, method: str, csrf: str | None) -> SessionInfo:
    """The session behind a cookie, for a request of ``method``. Blocking on a cache miss (call from a thread).

    :raises Unauthorized: the session is unknown, expired, logged out, or its key was revoked.
    :raises CsrfRefused: a state-changing request without the session's CSRF token.
    """
    session = sessions.authenticate(token)
    if session is None:
        raise Unauthorized("the console session expired or was ended; log in again")
    if method.upper() not in SAFE_METHODS and not sessions.csrf_ok(token, csrf):
        raise CsrfRefused(f"missing or wrong {CSRF_HEADER} header for a console session request")
    return session
