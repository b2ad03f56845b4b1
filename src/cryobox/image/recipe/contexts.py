"""Splitting an uploaded build context into one context blob per ``COPY`` step (:func:`split_context`).

The upload is a tar archive (plain or gzip) read in memory as a stream (:mod:`.tarblob`), never extracted on the
host. Its ``.dockerignore`` (if any) leaves paths out first, as Docker does. Each ``COPY`` source is a path or a glob
(``*``, ``?``, ``[…]``, per path segment, as Go's ``filepath.Match``) relative to the context root (a leading ``/``
is the root too); a matching directory brings everything under it. The selected members go into a deterministic
gzip'd tar named by its SHA-256 (``Step.context``), with their names relative to the context root, so the build VM
applies the same sources to it. Symlinks are copied as symlinks and not followed while selecting.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from cryobox.errors import InvalidArgument
from cryobox.image.recipe.dockerignore import IgnoreMatcher, go_clean
from cryobox.image.recipe.model import Recipe, Step
from cryobox.image.recipe.tarblob import ContextLimits, Entry, read_context, write_blob

_GLOB_CHARS = re.compile(r"[*?\[]")


def _glob_regex(pattern: str, step: Step) -> re.Pattern[str]:
    """Go's ``filepath.Match`` as a regular expression: wildcards never cross ``/``."""
    out = ""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i < len(pattern):
            out += re.escape(pattern[i])
            i += 1
        elif ch == "[":
            end = pattern.find("]", i)
            if end <= i:
                raise _bad_source(step, pattern, "has an unterminated [")
            body = pattern[i:end]
            negate = body[:1] == "^"
            body = body[1:] if negate else body
            out += "[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]"
            i = end + 1
        else:
            out += re.escape(ch)
    try:
        return re.compile(out + r"\Z")
    except re.error:
        raise _bad_source(step, pattern, "is not a valid pattern") from None


def _bad_source(step: Step, source: str, problem: str) -> InvalidArgument:
    return InvalidArgument(
        f"line {step.line}: COPY source {source!r} {problem}",
        details={"line": step.line, "instruction": "COPY", "source": source},
    )


class _Tree:
    """The context's paths after ``.dockerignore``: members, and the directories their names imply."""

    def __init__(self, entries: dict[str, Entry]) -> None:
        self.entries = entries
        implied = {name.rsplit("/", 1)[0] for name in entries if "/" in name}
        while True:
            more = {name.rsplit("/", 1)[0] for name in implied if "/" in name} - implied
            if not more:
                break
            implied |= more
        self.paths = sorted(set(entries) | implied)

    def under(self, root: str) -> list[str]:
        """The members at ``root`` and below it (everything for ``.``)."""
        if root == ".":
            return list(self.entries)
        found = [root] if root in self.entries else []
        start = bisect.bisect_left(self.paths, root + "/")
        for path in self.paths[start:]:
            if not path.startswith(root + "/"):
                break
            if path in self.entries:
                found.append(path)
        return found

    def exists(self, path: str) -> bool:
        index = bisect.bisect_left(self.paths, path)
        return index < len(self.paths) and self.paths[index] == path


def _roots(tree: _Tree, source: str, step: Step) -> list[str]:
    cleaned = go_clean(source.lstrip("/") or ".")
    if cleaned == ".." or cleaned.startswith("../"):
        raise _bad_source(step, source, "leaves the build context")
    if not _GLOB_CHARS.search(cleaned):
        return [cleaned] if cleaned == "." or tree.exists(cleaned) else []
    regex = _glob_regex(cleaned, step)
    return [path for path in tree.paths if regex.match(path)]


def _select(tree: _Tree, step: Step, ignore: IgnoreMatcher) -> list[Entry]:
    names: set[str] = set()
    for source in step.args[:-1]:
        roots = _roots(tree, source, step)
        if not roots:
            cleaned = go_clean(source.lstrip("/") or ".")
            why = " (it is excluded by .dockerignore)" if ignore.ignored(cleaned) else ""
            raise _bad_source(step, source, f"matches nothing in the build context{why}")
        for root in roots:
            names.update(tree.under(root))
    return [tree.entries[name] for name in sorted(names)]


def _ignore(entries: dict[str, Entry]) -> IgnoreMatcher:
    dockerignore = entries.get(".dockerignore")
    if dockerignore is None or dockerignore.kind != "file":
        return IgnoreMatcher([])
    return IgnoreMatcher.from_text(dockerignore.data.decode("utf-8", errors="replace"))


def split_context(
    recipe: Recipe, context: BinaryIO | Path, *, limits: ContextLimits
) -> tuple[Recipe, dict[str, bytes]]:
    """The recipe with each ``COPY`` step's ``context`` filled, and the context blobs by SHA-256 (hex).

    A ``COPY`` step that already names a context (an E2B step's uploaded files) is left as it is. Raises
    :class:`~cryobox.errors.InvalidArgument` for a source that matches nothing or leaves the context and for
    members that cannot be copied (absolute or ``..`` names, devices, fifos), and
    :class:`~cryobox.errors.PayloadTooLarge` (HTTP 413, ``details.limit``) past ``limits``.
    """
    entries = read_context(context, limits)
    ignore = _ignore(entries)
    tree = _Tree({name: entry for name, entry in entries.items() if not ignore.ignored(name)})
    blobs: dict[str, bytes] = {}
    steps: list[Step] = []
    for step in recipe.steps:
        if step.op != "COPY" or step.context:
            steps.append(step)
            continue
        blob = write_blob(_select(tree, step, ignore))
        digest = hashlib.sha256(blob).hexdigest()
        blobs[digest] = blob
        steps.append(replace(step, context=digest))
    return replace(recipe, steps=tuple(steps)), blobs


__all__ = ["ContextLimits", "split_context"]
