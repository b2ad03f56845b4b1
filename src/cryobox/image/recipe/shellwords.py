"""Docker's word processing for Dockerfile arguments, ported from BuildKit (``frontend/dockerfile/shell/lex.go``
and ``parser/line_parsers.go``): quote removal, escapes and variable substitution (:func:`expand`), and the
quote-aware word splitting of ``ENV``/``LABEL``/``ARG`` arguments (:func:`split_words`, :func:`name_values`).

Substitution supports ``$VAR``, ``${VAR}``, ``${VAR:-word}``, ``${VAR-word}``, ``${VAR:+word}``, ``${VAR+word}``,
``${VAR:?message}`` and ``${VAR?message}``; an escaped ``\\$`` (or ``$`` in single quotes) stays literal; unset
variables expand to the empty string, as Docker does. The pattern modifiers (``#``, ``%``, ``/``) are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SPECIAL_PARAMS = frozenset("@*#?-$!0")


class WordError(ValueError):
    """A word Docker would refuse (an unterminated quote, a bad substitution); the caller names the line."""


class _Lexer:
    def __init__(self, text: str, env: Mapping[str, str], escape: str) -> None:
        self.text = text
        self.pos = 0
        self.env = env
        self.escape = escape

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def next(self) -> str:
        ch = self.peek()
        if ch:
            self.pos += 1
        return ch

    def stop_on(self, stop: str) -> str:
        out: list[str] = []
        while ch := self.peek():
            if stop and ch == stop:
                self.next()
                return "".join(out)
            if ch == "'":
                out.append(self.single_quote())
            elif ch == '"':
                out.append(self.double_quote())
            elif ch == "$":
                out.append(self.dollar())
            else:
                self.next()
                if ch == self.escape:
                    ch = self.next()
                    if not ch:
                        break
                out.append(ch)
        if stop:
            raise WordError(f"unexpected end of statement while looking for matching {stop}")
        return "".join(out)

    def single_quote(self) -> str:
        self.next()
        end = self.text.find("'", self.pos)
        if end < 0:
            raise WordError("unexpected end of statement while looking for matching single-quote")
        value = self.text[self.pos : end]
        self.pos = end + 1
        return value

    def double_quote(self) -> str:
        self.next()
        out: list[str] = []
        while True:
            ch = self.peek()
            if not ch:
                raise WordError("unexpected end of statement while looking for matching double-quote")
            if ch == '"':
                self.next()
                return "".join(out)
            if ch == "$":
                out.append(self.dollar())
                continue
            self.next()
            if ch == self.escape:
                following = self.peek()
                if not following:
                    continue
                if following in ('"', "$", self.escape):
                    ch = self.next()
            out.append(ch)

    def name(self) -> str:
        out: list[str] = []
        while ch := self.peek():
            if not out and ch.isdigit():
                while self.peek().isdigit():
                    out.append(self.next())
                return "".join(out)
            if not out and ch in _SPECIAL_PARAMS:
                return self.next()
            if not (ch.isalnum() or ch == "_"):
                break
            out.append(self.next())
        return "".join(out)

    def dollar(self) -> str:
        self.next()
        if self.peek() != "{":
            name = self.name()
            return self.env.get(name, "") if name else "$"
        self.next()
        if not self.peek():
            raise WordError("syntax error: missing '}'")
        if self.peek() in "{}:":
            raise WordError("syntax error: bad substitution")
        name = self.name()
        ch = self.next()
        if not ch:
            raise WordError("syntax error: missing '}'")
        if ch == "}":
            return self.env.get(name, "")
        modifier = ch
        if ch == ":":
            modifier += self.next()
        if modifier not in ("-", ":-", "+", ":+", "?", ":?"):
            raise WordError(f"unsupported modifier ({modifier}) in substitution")
        try:
            word = self.stop_on("}")
        except WordError:
            raise WordError("syntax error: missing '}'") from None
        value = self.env.get(name)
        present = value is not None and (value != "" or not modifier.startswith(":"))
        if modifier.endswith("-"):
            return value if present and value is not None else word
        if modifier.endswith("+"):
            return word if present else ""
        if not present or value is None:
            raise WordError(f"{name}: {word or 'is not allowed to be unset'}")
        return value


def expand(word: str, env: Mapping[str, str], *, escape: str = "\\") -> str:
    """``word`` with quotes removed, escapes resolved and variables from ``env`` substituted."""
    return _Lexer(word, env, escape).stop_on("")


def split_words(rest: str, *, escape: str = "\\") -> list[str]:
    """BuildKit's ``parseWords``: split on unquoted whitespace, keeping quotes and escapes in the words."""
    words: list[str] = []
    word = ""
    blank_ok = False
    quote = ""
    phase = "spaces"
    pos = 0
    while pos <= len(rest):
        ch = rest[pos] if pos < len(rest) else ""
        if phase == "spaces":
            if pos == len(rest):
                break
            if ch.isspace():
                pos += 1
                continue
            phase = "word"
        if pos == len(rest):
            if blank_ok or word:
                words.append(word)
            break
        if phase == "word":
            if ch.isspace():
                phase = "spaces"
                if blank_ok or word:
                    words.append(word)
                word, blank_ok = "", False
                pos += 1
                continue
            if ch in ("'", '"'):
                quote, blank_ok, phase = ch, True, "quote"
            if ch == escape:
                if pos + 1 == len(rest):
                    pos += 1
                    continue
                word += ch
                pos += 1
                ch = rest[pos]
            word += ch
        else:
            if ch == quote:
                phase = "word"
            if ch == escape and quote != "'":
                if pos + 1 == len(rest):
                    phase = "word"
                    pos += 1
                    continue
                word += ch
                pos += 1
                ch = rest[pos]
            word += ch
        pos += 1
    return words


def name_values(rest: str, keyword: str, *, escape: str = "\\") -> list[tuple[str, str]]:
    """BuildKit's ``parseNameVal`` (``ENV``, ``LABEL``): ``name value`` (the old form: the rest of the line is the
    value) or ``name=value …``; the names and values are still raw (unexpanded)."""
    words = split_words(rest, escape=escape)
    if not words:
        raise WordError(f"{keyword} requires at least one argument")
    if "=" not in words[0]:
        parts = re.split(r"\s+", rest.strip(), maxsplit=1)
        if len(parts) < 2:
            raise WordError(f"{keyword} must have two arguments")
        return [(parts[0], parts[1])]
    pairs: list[tuple[str, str]] = []
    for word in words:
        if "=" not in word:
            raise WordError(f"syntax error - can't find = in {word!r}. Must be of the form: name=value")
        key, _, value = word.partition("=")
        pairs.append((key, value))
    return pairs


__all__ = ["WordError", "expand", "name_values", "split_words"]
