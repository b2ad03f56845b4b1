"""``.dockerignore`` as Docker implements it (``moby/patternmatcher`` and its ``ignorefile`` reader).

Lines starting with ``#`` are comments; patterns are cleaned like Go's ``filepath.Clean`` (so ``./a`` and ``/a``
both mean ``a`` relative to the context root); ``*`` and ``?`` match within one path segment, ``**`` any number of
segments (even none), ``[…]`` a character class, ``\\`` escapes; ``!`` makes an exception. The last pattern that
matches a path, or one of its parent directories, decides (:meth:`IgnoreMatcher.ignored`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cryobox.errors import InvalidArgument

_REGEX_SPECIAL = frozenset(".+()|{}$^")


def go_clean(path: str) -> str:
    """Go's ``path.Clean``: no empty, ``.`` or (resolvable) ``..`` segments, no trailing slash."""
    if not path:
        return "."
    rooted = path.startswith("/")
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out and out[-1] != "..":
                out.pop()
            elif not rooted:
                out.append("..")
            continue
        out.append(part)
    cleaned = "/".join(out)
    return ("/" + cleaned) if rooted else (cleaned or ".")


def read_patterns(text: str) -> list[str]:
    """The patterns of a ``.dockerignore`` file (``ignorefile.ReadAll``)."""
    patterns: list[str] = []
    for index, line in enumerate(text.split("\n")):
        if index == 0:
            line = line.removeprefix("\ufeff")
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern.startswith("!")
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = go_clean(pattern)
            if len(pattern) > 1 and pattern.startswith("/"):
                pattern = pattern[1:]
        patterns.append("!" + pattern if invert else pattern)
    return patterns


@dataclass(frozen=True)
class _Pattern:
    exclusion: bool
    kind: str
    """``exact``, ``prefix`` (``a/**``), ``suffix`` (``**/a``) or ``regexp``, as patternmatcher decides."""
    text: str
    regex: re.Pattern[str] | None

    def match(self, path: str) -> bool:
        if self.kind == "exact":
            return path == self.text
        if self.kind == "prefix":
            return path.startswith(self.text[:-2])
        if self.kind == "suffix":
            suffix = self.text[2:]
            return path.endswith(suffix) or (suffix.startswith("/") and path == suffix[1:])
        return self.regex is not None and self.regex.match(path) is not None


def _compile(text: str, exclusion: bool) -> _Pattern:
    regex = "^"
    kind = "exact"
    i = 0
    n = len(text)
    while i < n:
        first = i == 0
        ch = text[i]
        i += 1
        if ch == "*":
            if i < n and text[i] == "*":
                i += 1
                if i < n and text[i] == "/":
                    i += 1
                if i >= n:
                    if kind == "exact":
                        kind = "prefix"
                    else:
                        regex += ".*"
                        kind = "regexp"
                else:
                    regex += "(.*/)?"
                    kind = "regexp"
                if first:
                    kind = "suffix"
            else:
                regex += "[^/]*"
                kind = "regexp"
        elif ch == "?":
            regex += "[^/]"
            kind = "regexp"
        elif ch in _REGEX_SPECIAL:
            regex += "\\" + ch
        elif ch == "\\":
            if i < n:
                regex += re.escape(text[i])
                i += 1
            else:
                regex += "\\\\"
        elif ch in "[]":
            regex += ch
            kind = "regexp"
        else:
            regex += ch
    if kind != "regexp":
        return _Pattern(exclusion, kind, text, None)
    try:
        return _Pattern(exclusion, kind, text, re.compile(regex + "$", re.DOTALL))
    except re.error as exc:
        raise InvalidArgument(f".dockerignore: bad pattern {text!r}: {exc}", details={"pattern": text}) from None


class IgnoreMatcher:
    """The patterns of one ``.dockerignore``; ``ignored(path)`` for paths relative to the context root."""

    def __init__(self, patterns: list[str]) -> None:
        compiled: list[_Pattern] = []
        for raw in patterns:
            pattern = raw.strip()
            if not pattern:
                continue
            pattern = go_clean(pattern)
            exclusion = pattern.startswith("!")
            if exclusion:
                if len(pattern) == 1:
                    raise InvalidArgument('.dockerignore: illegal exclusion pattern: "!"', details={"pattern": raw})
                pattern = pattern[1:]
            compiled.append(_compile(pattern, exclusion))
        self._patterns = tuple(compiled)

    @classmethod
    def from_text(cls, text: str) -> IgnoreMatcher:
        return cls(read_patterns(text))

    def ignored(self, path: str) -> bool:
        """``MatchesOrParentMatches``: whether Docker leaves ``path`` out of the build context."""
        path = go_clean(path)
        parent = path.rpartition("/")[0] if "/" in path else "."
        parents = parent.split("/") if parent != "." else []
        matched = False
        for pattern in self._patterns:
            if pattern.exclusion != matched:
                continue
            hit = pattern.match(path)
            if not hit:
                hit = any(pattern.match("/".join(parents[: i + 1])) for i in range(len(parents)))
            if hit:
                matched = not pattern.exclusion
        return matched


__all__ = ["IgnoreMatcher", "go_clean", "read_patterns"]
