"""A create's ``templateID`` of the form ``name:tag`` (what E2B's SDKs pass after ``Template.build`` and tags:
``Sandbox.create("my-template:stable")``).

cryobox creates a sandbox from a template's newest ready build only (the generation the template serves now;
older builds' tags are bookkeeping, ``GET /templates/{id}/tags``). So ``name:tag`` is ``name`` when ``tag`` is
on that build; a tag on an older build is a 409 naming both builds, an unknown tag a 404, and nothing is created.
A template built without E2B's builds (``base``, ``code-interpreter``) has one build, its ``default``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import NotFound, StateError
from ...registry.builds import BuildRecord

DEFAULT_TAG = "default"


def split_name(name: str) -> tuple[str, str | None]:
    """``name:tag`` -> (name, tag)."""
    base, sep, tag = name.partition(":")
    return base, (tag if sep else None)


def tagged_template(name: str, tag: str, builds: Sequence[BuildRecord]) -> str:
    """The template a create of ``name:tag`` restores (``name``), given the template's ``builds`` (any order).

    :raises NotFound: no ready build of ``name`` carries ``tag``.
    :raises StateError: the tagged build is not the one ``name`` serves now (its newest ready build)."""
    ready = [b for b in builds if b.status == "ready"]
    if not ready:
        if tag == DEFAULT_TAG and not builds:
            return name
        raise NotFound(f"template {name!r} has no ready build tagged {tag!r}", details={"tag": tag})
    current = max(ready, key=lambda b: (b.finished_at or b.created_at, b.created_at))
    if tag in current.tags:
        return name
    if not any(tag in b.tags for b in ready):
        raise NotFound(f"template {name!r} has no ready build tagged {tag!r}", details={"tag": tag})
    raise StateError(
        f"{name}:{tag} is an older build of {name!r}; cryobox creates sandboxes from a template's newest build "
        f"({current.build_id}, tagged {', '.join(current.tags) or 'nothing'}) only",
        details={"tag": tag, "build_id": current.build_id},
    )
