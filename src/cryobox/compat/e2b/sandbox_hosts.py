"""Sandbox hosts: ``{port}-{sandbox_id}.{domain}`` reaches guest ``port`` of the sandbox, as E2B's do.

With a sandbox domain configured (``--sandbox-domain``, ``CRYOBOX_SANDBOX_DOMAIN``) the E2B SDK needs no sandbox
URL: it sends envd's calls to ``https://49983-{id}.{domain}`` and ``Sandbox.get_host(port)`` is
``{port}-{id}.{domain}``. :class:`SandboxHosts` sits in front of the whole app and turns such a request into the
sandbox URL's form (:mod:`.sandbox_url`): its path below ``/e2b/sandbox`` and ``E2b-Sandbox-Id`` and
``E2b-Sandbox-Port`` taken from the host — whatever ``E2b-*`` headers the client sent are dropped first, so a
host for a guest port never opens envd. Everything after that is the sandbox URL's: the front gate's token check
and lockout, the body caps, envd on 49983, the port proxy (HTTP and WebSocket) elsewhere. The guest sees the
request's own path.

The host is the ``Host`` header (HTTP/2's ``:authority``, which ASGI servers hand over as ``Host``), matched
case-insensitively, a port and one trailing dot ignored; only one label may stand before the domain, its port
``1..65535`` without leading zeros. Any other host (the API's own, ``api.{domain}``) goes to the app unchanged.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from ...errors import InvalidArgument
from .access import PORT_HEADER, SANDBOX_HEADER
from .sandbox_url import PREFIX

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_SANDBOX_LABEL = re.compile(r"^(?P<port>[1-9][0-9]{0,4})-(?P<id>[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)$")
"""``{port}-{id}``: cryobox's sandbox ids are lower-case letters, digits and ``-`` (``sb-`` and hex)."""
_MAX_LABEL = 63
_MAX_NAME = 253
_ROUTED = frozenset({SANDBOX_HEADER.encode(), PORT_HEADER.encode()})


def normal_domain(text: str) -> str:
    """``text`` as a sandbox domain: a DNS name (lower case, no final dot).

    :raises InvalidArgument: not a host name (a URL, a port, a wildcard, an empty label)."""
    name = text.strip().lower()
    name = name[:-1] if name.endswith(".") else name
    labels = name.split(".")
    if not name or len(name) > _MAX_NAME - _MAX_LABEL - 1 or not all(_LABEL.match(label) for label in labels):
        raise InvalidArgument(
            f"sandbox domain {text[:80]!r} is not a DNS name (like sandbox.example.com: no scheme, port or '*')",
            details={"field": "sandbox_domain"},
        )
    return name


def parse_host(host: str, domain: str) -> tuple[int, str] | None:
    """``(port, sandbox_id)`` when ``host`` is ``{port}-{sandbox_id}.{domain}`` (``domain`` normal), else None."""
    name = host.strip().lower()
    if name.startswith("["):  # an IPv6 literal
        return None
    name = name.rpartition(":")[0] if ":" in name else name
    name = name[:-1] if name.endswith(".") else name
    label, dot, rest = name.partition(".")
    if not dot or rest != domain or len(label) > _MAX_LABEL:
        return None
    found = _SANDBOX_LABEL.match(label)
    if found is None or int(found["port"]) > 65535:
        return None
    return int(found["port"]), found["id"]


def _host_header(scope: Scope) -> str | None:
    """The request's one ``Host`` (None: none, or several)."""
    hosts = [value for name, value in scope.get("headers", []) if name == b"host"]
    return hosts[0].decode("latin-1") if len(hosts) == 1 else None


def routed_scope(scope: Scope, port: int, sandbox_id: str) -> Scope:
    """``scope`` as a request to the sandbox URL: the path below :data:`~.sandbox_url.PREFIX`, the sandbox and
    port in the ``E2b-*`` headers (the client's own dropped)."""
    headers = [(name, value) for name, value in scope.get("headers", []) if name.lower() not in _ROUTED]
    headers += [(SANDBOX_HEADER.encode(), sandbox_id.encode()), (PORT_HEADER.encode(), str(port).encode())]
    path = str(scope.get("path") or "/")
    raw = scope.get("raw_path")
    raw_path = bytes(raw) if raw else path.encode()
    return {
        **scope,
        "path": PREFIX + path,
        "raw_path": PREFIX.encode() + raw_path,
        "headers": headers,
    }


class SandboxHosts:
    """ASGI middleware: requests for ``{port}-{id}.{domain}`` go to the sandbox URL (module doc)."""

    def __init__(self, app: ASGIApp, domain: str) -> None:
        self.app = app
        self.domain = normal_domain(domain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = _host_header(scope)
            target = parse_host(host, self.domain) if host is not None else None
            if target is not None:
                await self.app(routed_scope(scope, *target), receive, send)
                return
        await self.app(scope, receive, send)
