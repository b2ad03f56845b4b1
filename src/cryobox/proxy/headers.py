"""What headers cross the port proxy, both ways.

Towards the upstream (the guest, which is hostile): hop-by-hop headers (RFC 9110 §7.6.1, plus every header
the ``Connection`` header names) are removed, and so is every credential the proxy consumed — ``Authorization``,
``Proxy-Authorization``, ``X-API-Key``, ``X-Access-Token``, ``E2b-Traffic-Access-Token``, every header named
in ``strip`` and every cookie named in ``strip`` (names compared case-insensitively) — before the target's own
headers (an agent's node token) are added. ``Host`` is left to the HTTP client (the upstream's address);
``X-Forwarded-For``/``-Proto``/``-Host`` say who asked. An untrusted hop (the control plane, facing clients)
replaces whatever forwarding headers the client sent; a trusted one (an agent, whose callers hold the node
token) keeps them and appends to ``X-Forwarded-For``. A ``host`` given (a sandbox policy's ``mask_request_host``)
is sent as ``Host`` instead of the upstream's address.

Towards the client: hop-by-hop headers are removed, and ``Date``/``Server`` (the ASGI server adds its own).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from starlette.types import Scope

RawHeaders = list[tuple[bytes, bytes]]
Headers = list[tuple[str, str]]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
CREDENTIALS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "x-access-token", "e2b-traffic-access-token"}
)
"""Consumed by the proxy (or by a hop before it), never forwarded to the guest."""
FORWARDING = frozenset({"forwarded", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-real-ip"})
REQUEST_ONLY = frozenset({"host", "expect"})
"""Set by the HTTP client for the upstream (``Host``), or answered by the ASGI server (``Expect``)."""
WEBSOCKET_HANDSHAKE = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)
"""Negotiated per hop by the WebSocket client (its own key, extensions; subprotocols passed separately)."""
RESPONSE_DROPPED = frozenset({"date", "server"})
WEBSOCKET_ACCEPT_DROPPED = frozenset({"sec-websocket-accept", "sec-websocket-extensions", "sec-websocket-protocol"})


def _lower(names: Iterable[str]) -> frozenset[str]:
    return frozenset(name.strip().lower() for name in names if name.strip())


def connection_named(values: Iterable[str]) -> frozenset[str]:
    """The header names listed in ``Connection`` header values (``close`` and ``keep-alive`` included)."""
    return _lower(token for value in values for token in value.split(","))


def _decoded(raw: Iterable[tuple[bytes, bytes]]) -> Headers:
    return [(bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1")) for name, value in raw]


def _cookies(value: str, strip: frozenset[str]) -> str:
    kept = [part.strip() for part in value.split(";") if part.strip()]
    return "; ".join(part for part in kept if part.partition("=")[0].strip().lower() not in strip)


def _client_host(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _proto(scope: Scope) -> str:
    scheme = str(scope.get("scheme") or "http")
    return {"ws": "http", "wss": "https"}.get(scheme, scheme)


def request_headers(
    scope: Scope,
    extra: Mapping[str, str],
    *,
    strip: Collection[str] = (),
    trust_forwarded: bool = False,
    websocket: bool = False,
    host: str | None = None,
) -> Headers:
    """The headers to send upstream for the request in ``scope``, ``extra`` (the target's) added last; ``host``:
    the ``Host`` the upstream gets (default: its own address, set by the HTTP client)."""
    incoming = _decoded(scope.get("headers", []))
    stripped = _lower(strip)
    dropped = HOP_BY_HOP | CREDENTIALS | REQUEST_ONLY | stripped
    dropped |= connection_named(value for name, value in incoming if name == "connection")
    if websocket:
        dropped |= WEBSOCKET_HANDSHAKE
    if not trust_forwarded:
        dropped |= FORWARDING
    out: Headers = []
    prior_for: list[str] = []
    original_host = ""
    for name, value in incoming:
        if name == "host":
            original_host = original_host or value
        if name in dropped:
            continue
        if name == "x-forwarded-for":
            prior_for.append(value.strip())
            continue
        if name == "cookie" and stripped:
            value = _cookies(value, stripped)
            if not value:
                continue
        out.append((name, value))
    present = {name for name, _ in out}
    out.append(("x-forwarded-for", ", ".join([*filter(None, prior_for), _client_host(scope)])))
    if "x-forwarded-proto" not in present:
        out.append(("x-forwarded-proto", _proto(scope)))
    if "x-forwarded-host" not in present and original_host:
        out.append(("x-forwarded-host", original_host))
    extra_names = _lower(extra)
    out = [(name, value) for name, value in out if name not in extra_names]
    out.extend((name.lower(), value) for name, value in extra.items())
    if host is not None:
        out = [("host", host), *[(name, value) for name, value in out if name != "host"]]
    return out


def response_headers(raw: Iterable[tuple[bytes, bytes]], *, websocket_accept: bool = False) -> RawHeaders:
    """The upstream's response headers as they go back to the client."""
    pairs = [(bytes(name).lower(), bytes(value)) for name, value in raw]
    named = connection_named(value.decode("latin-1") for name, value in pairs if name == b"connection")
    dropped = HOP_BY_HOP | RESPONSE_DROPPED | named
    if websocket_accept:
        dropped |= WEBSOCKET_ACCEPT_DROPPED | {"content-length", "content-type"}
    return [(name, value) for name, value in pairs if name.decode("latin-1") not in dropped]


__all__ = ["CREDENTIALS", "HOP_BY_HOP", "connection_named", "request_headers", "response_headers"]
