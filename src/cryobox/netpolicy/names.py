"""Host names in a policy: an exact name (``example.org``) or a wildcard for every name below one
(``*.example.org``: ``a.example.org``, ``a.b.example.org``, never ``example.org`` itself).

Names are compared in their ASCII form, lowercased, without a trailing dot. A name in a policy is at most 253
characters of labels of letters, digits, ``-`` and ``_`` (1-63 each); Unicode names are converted with IDNA first.
"""

from __future__ import annotations

import re

from ..errors import InvalidArgument

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
MAX_NAME = 253


def _ascii(name: str) -> str:
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError as err:
        raise InvalidArgument(f"host name {name!r} is not a valid name", details={"name": name}) from err


def normalize_name(raw: str, *, wildcard: bool = True) -> str:
    """``raw`` as a policy compares it. :raises InvalidArgument: not a host name (or a wildcard where none may be)."""
    name = raw.strip().lower().rstrip(".")
    if not name.isascii():
        name = _ascii(name)
    labels = name.split(".")
    if labels and labels[0] == "*":
        if not wildcard:
            raise InvalidArgument(f"{raw!r}: a wildcard is not a host name", details={"name": raw})
        labels = labels[1:]
        if len(labels) < 2:
            raise InvalidArgument(
                f"{raw!r}: a wildcard needs a domain of at least two labels (like *.example.org)", details={"name": raw}
            )
    if not labels or len(name) > MAX_NAME or not all(_LABEL.match(label) for label in labels):
        raise InvalidArgument(f"{raw!r} is neither an IPv4 network nor a host name", details={"name": raw})
    if labels[-1].isdigit():
        raise InvalidArgument(f"{raw!r} is neither an IPv4 network nor a host name", details={"name": raw})
    return name


def matches_name(pattern: str, name: str) -> bool:
    """Whether normalized ``name`` is ``pattern`` (exact) or lies below it (``*.`` wildcard)."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


__all__ = ["MAX_NAME", "matches_name", "normalize_name"]
