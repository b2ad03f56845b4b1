"""Image references as Docker reads them: ``[registry/]name[:tag][@digest]``.

Docker's normalisation (``distribution/reference``): the first path component is a registry host only when it
contains a ``.`` or a ``:`` (a port), is ``localhost``, or has an upper-case letter; otherwise the registry is
``docker.io`` and a one-component name gets ``library/`` in front (``busybox`` is ``docker.io/library/busybox``).
``index.docker.io`` is ``docker.io``. With neither tag nor digest the tag is ``latest``; with both, the digest
decides what is pulled (the tag is kept for display).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InvalidArgument

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
"""Where ``docker.io``'s distribution API answers."""
DEFAULT_TAG = "latest"
MAX_NAME = 255

_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"^(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
"""The only digests cryobox pulls by (and the only ones it lets name a file)."""


@dataclass(frozen=True)
class Reference:
    registry: str
    """The registry as named (``docker.io``, ``ghcr.io``, ``127.0.0.1:5000``): the key of mirrors and credentials."""
    repository: str
    """The path inside it (``library/busybox``)."""
    tag: str | None = None
    digest: str | None = None

    @property
    def target(self) -> str:
        """What the manifest URL names: the digest when there is one, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def api_host(self) -> str:
        """The host the distribution API answers on (``registry-1.docker.io`` for ``docker.io``)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def is_digest(value: str) -> bool:
    return DIGEST.match(value) is not None


def parse_reference(text: str) -> Reference:
    """Read ``text`` by Docker's rules; :class:`InvalidArgument` names what is wrong with it."""
    if not text or text != text.strip():
        raise InvalidArgument(f"invalid image reference {text!r}: empty or surrounded by spaces")
    rest, _, digest = text.partition("@")
    if digest and not is_digest(digest):
        raise InvalidArgument(f"invalid image reference {text!r}: the digest must be sha256:<64 hex digits>")
    tag: str | None = None
    colon, slash = rest.rfind(":"), rest.rfind("/")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.match(tag):
            raise InvalidArgument(f"invalid image reference {text!r}: bad tag {tag!r}")
    registry, path = _split_registry(rest)
    if not _DOMAIN.match(registry):
        raise InvalidArgument(f"invalid image reference {text!r}: bad registry host {registry!r}")
    if not path or not all(_COMPONENT.match(part) for part in path.split("/")):
        raise InvalidArgument(
            f"invalid image reference {text!r}: a name is lower-case letters, digits and separators (. _ __ -)"
        )
    if len(f"{registry}/{path}") > MAX_NAME:
        raise InvalidArgument(f"invalid image reference {text!r}: the name is longer than {MAX_NAME} characters")
    if tag is None and not digest:
        tag = DEFAULT_TAG
    return Reference(registry=registry, repository=path, tag=tag, digest=digest or None)


def _split_registry(name: str) -> tuple[str, str]:
    first, sep, rest = name.partition("/")
    if sep and (any(c in first for c in ".:") or first == "localhost" or first.lower() != first):
        registry = DOCKER_HUB if first == "index.docker.io" else first
        path = rest
    else:
        registry, path = DOCKER_HUB, name
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return registry, path


__all__ = ["DEFAULT_TAG", "DIGEST", "DOCKER_HUB", "Reference", "is_digest", "parse_reference"]
