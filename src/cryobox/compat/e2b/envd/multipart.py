"""A ``multipart/form-data`` body (RFC 7578) split into its parts, byte-exact.

The body is already in memory (bounded by the caller). Each part keeps its raw content: no transfer decoding,
no newline translation. ``Content-Disposition`` parameters are read like Go's ``mime.ParseMediaType`` reads
them for envd: a quoted string loses its quotes and backslash escapes, RFC 2231 ``filename*=UTF-8''…`` is
percent-decoded; nothing else is touched (httpx's ``%22`` for a ``"`` in a file name stays as sent, as in envd).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from ....errors import InvalidArgument

MAX_PARTS = 1000
MAX_HEADER_BYTES = 16 << 10


@dataclass(frozen=True)
class Part:
    name: str | None
    filename: str | None
    content: bytes


def _split_params(value: str) -> list[str]:
    """``value`` split at the semicolons outside quoted strings."""
    items: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == ";" and not quoted:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        out: list[str] = []
        escaped = False
        for char in value[1:-1]:
            if escaped or char != "\\":
                out.append(char)
                escaped = False
            else:
                escaped = True
        return "".join(out)
    return value


def header_params(value: str) -> tuple[str, dict[str, str]]:
    """A header's value and its parameters (names lower-cased)."""
    first, *rest = _split_params(value)
    params: dict[str, str] = {}
    for item in rest:
        key, sep, raw = item.partition("=")
        if not sep:
            continue
        key = key.strip().lower()
        raw = raw.strip()
        if key.endswith("*"):
            charset, _, encoded = raw.partition("''")
            try:
                params[key[:-1]] = urllib.parse.unquote(encoded, encoding=charset or "utf-8", errors="strict")
            except (LookupError, UnicodeDecodeError):
                continue
        else:
            params.setdefault(key, _unquote(raw))
    return first.strip().lower(), params


def boundary_of(content_type: str) -> bytes:
    media, params = header_params(content_type)
    boundary = params.get("boundary", "")
    if not media.startswith("multipart/") or not boundary or len(boundary) > 200:
        raise InvalidArgument("multipart body without a usable boundary")
    return boundary.encode("latin-1", errors="replace")


def _part(raw: bytes) -> Part:
    if raw.startswith(b"\r\n"):
        head, content = b"", raw[2:]
    else:
        head, sep, content = raw.partition(b"\r\n\r\n")
        if not sep:
            raise InvalidArgument("multipart part without a header end")
    if len(head) > MAX_HEADER_BYTES:
        raise InvalidArgument("multipart part headers too large")
    name = filename = None
    for line in head.decode("utf-8", errors="replace").split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-disposition":
            _, params = header_params(value)
            name, filename = params.get("name"), params.get("filename")
    return Part(name=name, filename=filename, content=content)


def _is_delimiter(body: bytes, after: int) -> bool:
    """Whether a boundary ending at ``after`` is a real delimiter: ``--`` (the last) or blanks and CRLF."""
    if body.startswith(b"--", after):
        return True
    line_end = body.find(b"\r\n", after)
    return line_end >= 0 and not body[after:line_end].strip(b" \t")


def _find_delimiter(body: bytes, delimiter: bytes, start: int) -> int:
    """Where the next ``CRLF--boundary`` delimiter starts at or after ``start`` (-1: none)."""
    marker = b"\r\n" + delimiter
    at = body.find(marker, start)
    while at >= 0 and not _is_delimiter(body, at + len(marker)):
        at = body.find(marker, at + 1)
    return at


def parse(body: bytes, content_type: str) -> list[Part]:
    """The parts of ``body``; :raises InvalidArgument: not a well-formed multipart body."""
    delimiter = b"--" + boundary_of(content_type)
    if body.startswith(delimiter) and _is_delimiter(body, len(delimiter)):
        pos = len(delimiter)
    else:
        first = _find_delimiter(body, delimiter, 0)
        if first < 0:
            raise InvalidArgument("multipart body does not start with its boundary")
        pos = first + 2 + len(delimiter)
    parts: list[Part] = []
    while not body.startswith(b"--", pos):
        pos = body.index(b"\r\n", pos) + 2  # _is_delimiter saw the line end
        end = _find_delimiter(body, delimiter, pos)
        if end < 0:
            raise InvalidArgument("multipart body ends inside a part")
        parts.append(_part(body[pos:end]))
        if len(parts) > MAX_PARTS:
            raise InvalidArgument(f"more than {MAX_PARTS} multipart parts")
        pos = end + 2 + len(delimiter)
    return parts
