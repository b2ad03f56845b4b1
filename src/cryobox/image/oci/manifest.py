"""Indexes and manifests (OCI and Docker v2) read from JSON, and the choice of one platform from an index.

A reference names either an *index* (OCI image index, Docker manifest list: one manifest per platform) or a
*manifest* (a config and its layers). Docker's schema 1 is refused. Every digest read here is checked to be
``sha256:<hex>`` before anything uses it (it later names files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...errors import ImagePullFailed
from .mediatypes import CONFIGS, DOCKER_SCHEMA1, INDEXES, MANIFESTS
from .reference import is_digest

DEFAULT_PLATFORM = "linux/amd64"
ATTESTATION = "vnd.docker.reference.type"
"""The annotation of BuildKit's attestation manifests (``unknown/unknown`` entries of an index)."""


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: str = ""
    """``os/architecture[/variant]`` for an index's entries; empty elsewhere."""
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Index:
    manifests: list[Descriptor]


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: list[Descriptor]


def parse_document(data: bytes, content_type: str = "") -> Index | Manifest:
    """An index or a manifest from its bytes (``content_type``: the registry's ``Content-Type``, if any)."""
    doc = _json(data, "manifest")
    media_type = str(doc.get("mediaType") or content_type.split(";")[0].strip())
    if media_type in DOCKER_SCHEMA1 or doc.get("schemaVersion") == 1:
        raise ImagePullFailed("Docker schema 1 manifests are not supported: push the image again with a newer tool")
    if media_type in INDEXES or (not media_type and "manifests" in doc):
        entries = _list(doc, "manifests")
        return Index([_descriptor(entry, with_platform=True) for entry in entries])
    if media_type in MANIFESTS or (not media_type and "layers" in doc):
        config = doc.get("config")
        if not isinstance(config, dict):
            raise ImagePullFailed("the manifest has no config")
        return Manifest(_descriptor(config), [_descriptor(layer) for layer in _list(doc, "layers")])
    raise ImagePullFailed(f"not an image manifest or index (media type {media_type!r})")


def select_platform(index: Index, platform: str = DEFAULT_PLATFORM) -> Descriptor:
    """The entry of ``index`` for ``platform`` (``os/arch``, or ``os/arch/variant`` to insist on a variant)."""
    want = platform.split("/")
    candidates = [
        entry
        for entry in index.manifests
        if entry.platform.split("/")[: len(want)] == want and ATTESTATION not in entry.annotations
    ]
    if not candidates:
        available = sorted({e.platform for e in index.manifests if e.platform and ATTESTATION not in e.annotations})
        raise ImagePullFailed(
            f"the image has no {platform} variant (it has: {', '.join(available) or 'none'})",
            details={"platform": platform, "available": available},
        )
    return candidates[0]


def check_config(descriptor: Descriptor) -> None:
    if descriptor.media_type and descriptor.media_type not in CONFIGS:
        raise ImagePullFailed(f"not an image: the config's media type is {descriptor.media_type!r}")


def _descriptor(raw: Any, *, with_platform: bool = False) -> Descriptor:
    if not isinstance(raw, dict):
        raise ImagePullFailed("a descriptor in the manifest is not an object")
    digest = raw.get("digest")
    size = raw.get("size")
    if not isinstance(digest, str) or not is_digest(digest):
        raise ImagePullFailed(f"unsupported or malformed digest {digest!r} (only sha256 is supported)")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImagePullFailed(f"descriptor {digest} has no valid size")
    if raw.get("urls"):
        raise ImagePullFailed(f"layer {digest} is a foreign layer (fetched from URLs): not supported")
    platform = ""
    if with_platform and isinstance(raw.get("platform"), dict):
        plat = raw["platform"]
        parts = [str(plat.get("os", "")), str(plat.get("architecture", ""))]
        if plat.get("variant"):
            parts.append(str(plat["variant"]))
        platform = "/".join(parts)
    annotations = raw.get("annotations")
    return Descriptor(
        media_type=str(raw.get("mediaType") or ""),
        digest=digest,
        size=size,
        platform=platform,
        annotations={str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {},
    )


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImagePullFailed(f"the {what} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ImagePullFailed(f"the {what} is not a JSON object")
    return doc


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ImagePullFailed(f"the manifest's {key!r} is not a list")
    return value


__all__ = ["DEFAULT_PLATFORM", "Descriptor", "Index", "Manifest", "check_config", "parse_document", "select_platform"]
