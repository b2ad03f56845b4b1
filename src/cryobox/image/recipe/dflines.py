"""A Dockerfile's lines as BuildKit reads them: the parser directives at the top (``# escape=``, ``# syntax=``),
comments, empty lines and line continuations, then each instruction split into its keyword, its leading
``--flag=value`` options and the rest (:func:`read_instructions`). Nothing here knows what an instruction means.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from cryobox.errors import InvalidArgument

_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
_DIRECTIVES = frozenset({"syntax", "escape", "check"})
_SYNTAX = re.compile(r"^(?:docker\.io/)?docker/dockerfile:1(?:\.\d+){0,2}(?:@sha256:[0-9a-f]{64})?$")
"""The frontends whose syntax this parser implements (``docker/dockerfile:1``, ``:1.7``, ``:1.7.1``, pinned or not)."""
_FLAG = re.compile(r"^--([A-Za-z][A-Za-z0-9-]*)(?:=(\"[^\"]*\"|'[^']*'|\S*))?(?:\s+|$)")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper-case."""
    flags: dict[str, str]
    """``--name=value`` options before the arguments (``--name`` alone has the value ``""``)."""
    rest: str
    """The arguments, raw (continuations joined, surrounding whitespace stripped)."""
    line: int
    """Where the instruction starts (1-based)."""

    def json_args(self) -> list[str] | None:
        """The exec (JSON array of strings) form's words, or None for the shell form."""
        text = self.rest.strip()
        if not (text.startswith("[") and text.endswith("]")):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None
        return [str(v) for v in value]


@dataclass(frozen=True)
class Document:
    escape: str
    instructions: tuple[Instruction, ...]


def _refuse(message: str, line: int, **details: object) -> InvalidArgument:
    return InvalidArgument(f"Dockerfile line {line}: {message}", details={"line": line, **details})


def _directive(line: str, number: int, seen: dict[str, str]) -> bool:
    """Record ``line`` if it is a parser directive; False once the directives are over."""
    match = _DIRECTIVE.match(line)
    if match is None or match.group(1).lower() not in _DIRECTIVES:
        return False
    name, value = match.group(1).lower(), match.group(2)
    if name in seen:
        raise _refuse(f"only one {name} parser directive can be used", number, directive=name)
    if name == "escape" and value not in ("\\", "`"):
        raise _refuse(f"invalid escape token {value!r} does not match ` or \\", number, directive=name)
    if name == "syntax" and not _SYNTAX.match(value):
        raise _refuse(
            f"syntax={value} is not supported: cryobox implements docker/dockerfile:1 only",
            number,
            directive=name,
        )
    seen[name] = value
    return True


def _trim_continuation(line: str, escape: str) -> tuple[str, bool]:
    """``line`` without a trailing escape character, and whether the instruction ends on it."""
    stripped = line.rstrip(" \t")
    if stripped.endswith(escape):
        return stripped[: -len(escape)], False
    return line, True


def _split(text: str, line: int) -> Instruction:
    parts = re.split(r"\s+", text.strip(), maxsplit=1)
    keyword = parts[0].upper()
    rest = parts[1] if len(parts) > 1 else ""
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        if rest == "--" or rest.startswith("-- "):
            rest = rest[2:].lstrip()
            break
        match = _FLAG.match(rest)
        if match is None:
            raise _refuse(f"{keyword}: cannot read the option in {rest.split()[0]!r}", line, instruction=keyword)
        value = match.group(2) or ""
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        flags[match.group(1).lower()] = value
        rest = rest[match.end() :]
    return Instruction(keyword=keyword, flags=flags, rest=rest.strip(), line=line)


def read_instructions(text: str) -> Document:
    """The directives and instructions of a Dockerfile."""
    lines = text.split("\n")
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    seen: dict[str, str] = {}
    in_directives = True
    instructions: list[Instruction] = []
    escape = "\\"
    index = 0
    while index < len(lines):
        raw = lines[index]
        index += 1
        if in_directives:
            if _directive(raw, index, seen):
                escape = seen.get("escape", "\\")
                continue
            in_directives = False
        first = raw.lstrip(" \t")
        if first.startswith("#"):
            continue
        joined, ended = _trim_continuation(first, escape)
        if ended and not joined.strip():
            continue
        start = index
        while not ended and index < len(lines):
            raw = lines[index]
            index += 1
            if raw.lstrip(" \t").startswith("#") or not raw.strip():
                continue
            more, ended = _trim_continuation(raw, escape)
            joined += more
        if joined.strip():
            instructions.append(_split(joined, start))
    return Document(escape=escape, instructions=tuple(instructions))


__all__ = ["Document", "Instruction", "read_instructions"]
