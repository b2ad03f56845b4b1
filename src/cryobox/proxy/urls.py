"""The upstream URL of a proxied request, and the part of a request's path that follows a route's prefix.

The path is kept percent-encoded as the client sent it (``%2F`` stays ``%2F``). A path with a ``.`` or ``..``
segment (literal or percent-encoded) is refused: URL normalisation would resolve it against the target's path
prefix, and an agent target's prefix is what keeps a client, whose request carries the agent's node token onwards,
inside its own sandbox's port route.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

import httpx
from starlette.types import Scope

from ..errors import InvalidArgument
from .target import PortTarget

_SCHEMES = {"http": "ws", "https": "wss"}


def route_suffix(scope: Scope, prefix_segments: int) -> str:
    """What follows the first ``prefix_segments`` segments of the request's path, percent-encoded as sent,
    starting with ``/`` (``/`` when nothing follows)."""
    raw = scope.get("raw_path")
    text = bytes(raw).decode("latin-1") if raw else quote(str(scope.get("path", "/")))
    root = str(scope.get("root_path") or "")
    if root and text.startswith(root):
        text = text[len(root) :]
    parts = text.split("/")
    rest = parts[prefix_segments + 1 :]
    return "/" + "/".join(rest)


def _check_path(path: str) -> None:
    if not path.startswith("/"):
        raise InvalidArgument("a proxied path must start with '/'", details={"path": path})
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in path):
        raise InvalidArgument("a proxied path must not contain spaces or control characters")
    for segment in path.split("/"):
        if unquote(segment) in (".", ".."):
            raise InvalidArgument("a proxied path must not contain '.' or '..' segments", details={"path": path})


def upstream_url(target: PortTarget, path: str, query: bytes, *, websocket: bool = False) -> str:
    """``target.url`` + ``path`` + ``?query``, as a ``ws(s)://`` URL when ``websocket``."""
    _check_path(path)
    base = httpx.URL(target.url.rstrip("/"))
    if base.scheme not in _SCHEMES or not base.host:
        raise InvalidArgument(f"a port target must be an http(s) URL, not {target.url!r}")
    text = str(base).rstrip("/") + path.replace("#", "%23")
    if query:
        text += "?" + query.decode("latin-1").replace("#", "%23")
    url = httpx.URL(text)
    prefix = base.raw_path.split(b"?")[0].rstrip(b"/")
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port) or not url.raw_path.startswith(
        prefix + b"/"
    ):
        raise InvalidArgument("the proxied path leaves the port's route", details={"path": path})
    if websocket:
        url = url.copy_with(scheme=_SCHEMES[url.scheme])
    return str(url)


__all__ = ["route_suffix", "upstream_url"]
