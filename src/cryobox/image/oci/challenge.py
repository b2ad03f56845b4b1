"""``WWW-Authenticate`` challenges (RFC 7235): ``Bearer realm="…",service="…",scope="…"`` or ``Basic realm="…"``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9_.+-]*)(?:\s+|$)")
_PARAM = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]*))\s*(?:,|$)')


@dataclass(frozen=True)
class Challenge:
    scheme: str
    """Lower-case: ``bearer`` or ``basic`` (or another the client does not answer)."""
    params: dict[str, str] = field(default_factory=dict)
    """Parameter names lower-case, values unquoted."""


def parse_challenges(header: str) -> list[Challenge]:
    """Every challenge in one header value (a server may offer several, comma-separated)."""
    found: list[Challenge] = []
    pos = 0
    while pos < len(header):
        scheme = _SCHEME.match(header, pos)
        if scheme is None:
            break
        pos = scheme.end()
        params: dict[str, str] = {}
        while (param := _PARAM.match(header, pos)) is not None and param.end() > pos:
            name, quoted, bare = param.groups()
            params[name.lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
            pos = param.end()
        found.append(Challenge(scheme.group(1).lower(), params))
        while pos < len(header) and header[pos] in ", ":
            pos += 1
    return found


__all__ = ["Challenge", "parse_challenges"]
