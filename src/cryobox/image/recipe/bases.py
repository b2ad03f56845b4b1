"""Which :class:`~cryobox.image.recipe.model.Base` an image reference (a Dockerfile's ``FROM``, E2B's
``fromImage``) stands for: Debian bookworm is built from Debian's archive, E2B's default image and ``cryobox/<name>``
are cryobox templates, everything else is an OCI image pulled from its registry."""

from __future__ import annotations

import re

from cryobox.image.recipe.model import Base

_DOCKER_HUB = ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/", "library/")
_BOOKWORM_TAG = re.compile(r"^(?:bookworm|12(?:\.\d+)*)(?:-slim)?$")
_TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*(?::[A-Za-z0-9._-]+)?$")


def _hub_name(ref: str) -> tuple[str, str]:
    """(repository without Docker Hub's prefixes, tag or ``""``); a digest reference keeps its ``@`` part."""
    name = ref
    for prefix in _DOCKER_HUB:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if "@" in name:
        return name, ""
    repo, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return name, ""
    return repo, tag


def base_of(ref: str) -> Base:
    """The base a reference stands for.

    * ``debian:bookworm``, ``debian:12``, ``debian:12.5``, their ``-slim`` variants (Docker Hub's prefixes allowed)
      -> ``Base("debian", "bookworm")``; any other Debian tag (or none: ``latest``) is pulled as an image.
    * ``e2bdev/base`` with any tag -> ``Base("template", "base")``.
    * ``cryobox/<name>[:tag]`` -> ``Base("template", "<name>[:tag]")`` (``:latest`` dropped).
    * ``scratch`` -> ``Base("image", "scratch")``; anything else -> ``Base("image", ref)`` as written.
    """
    ref = ref.strip()
    repo, tag = _hub_name(ref)
    if repo == "debian" and _BOOKWORM_TAG.match(tag):
        return Base("debian", "bookworm")
    if repo == "e2bdev/base":
        return Base("template", "base")
    if ref.startswith("cryobox/"):
        name = ref[len("cryobox/") :]
        if name.endswith(":latest"):
            name = name[: -len(":latest")]
        if _TEMPLATE_NAME.match(name):
            return Base("template", name)
    return Base("image", ref)


__all__ = ["base_of"]
