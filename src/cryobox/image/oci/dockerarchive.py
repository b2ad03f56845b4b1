"""``load_docker_archive``: an image from a ``docker save`` archive, read in place (nothing extracted but the
layer tars).

Two variants: the legacy one (``manifest.json`` naming ``<id>.json`` configs and ``<id>/layer.tar`` layers) and
Docker 25's, an OCI layout inside the archive whose ``manifest.json`` names ``blobs/sha256/…`` files (often through
symlinks). ``manifest.json`` is read when present (both variants have it); an archive with only ``index.json`` is
read as an OCI layout. ``ref`` picks an image by one of its ``RepoTags`` (Docker's normalisation applies, so
``busybox`` finds ``docker.io/library/busybox:latest``); without it the archive must hold one image.

A legacy layer is named by no digest: it is checked by its diff ID (the config's ``rootfs.diff_ids``), which for an
uncompressed layer is also the SHA-256 of the member. The returned digest is the config's (Docker's image ID).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ...errors import ImagePullFailed, InvalidArgument
from .assemble import assemble
from .blobs import read_bounded, read_chunks, sha256_digest, verify_digest
from .layout import load_layout_tree
from .limits import ImageLimits
from .manifest import DEFAULT_PLATFORM, Descriptor, Manifest
from .mediatypes import DOCKER_CONFIG
from .pulled import PulledImage
from .reference import parse_reference
from .trees import TarTree

MEMBER = "cryobox.member"
"""The annotation that carries a descriptor's file name in the archive (a legacy layer has no digest)."""
_DIGEST_NAME = re.compile(r"(?:^|/)(?:blobs/sha256/)?([a-f0-9]{64})(?:\.json)?$")


class _ArchiveBlobs:
    def __init__(self, tree: TarTree) -> None:
        self.tree = tree

    @contextlib.contextmanager
    def open_blob(self, descriptor: Descriptor, what: str) -> Iterator[Iterable[bytes]]:
        with self.tree.open(descriptor.annotations[MEMBER]) as stream:
            yield read_chunks(stream)


def load_docker_archive(
    path: Path,
    dest: Path,
    *,
    limits: ImageLimits,
    progress: Callable[[str], None],
    ref: str | None = None,
    platform: str = DEFAULT_PLATFORM,
) -> PulledImage:
    with TarTree(path) as tree:
        if not tree.exists("manifest.json"):
            if tree.exists("index.json"):
                return load_layout_tree(tree, dest, limits=limits, progress=progress, ref=ref, platform=platform)
            raise ImagePullFailed(f"{path} is not a docker save archive (no manifest.json)")
        with tree.open("manifest.json") as stream:
            raw = read_bounded(read_chunks(stream), limits.limit("max_document_bytes"), "manifest.json")
        entry = _entry(_json_list(raw), ref, path)
        config_name = _name(entry.get("Config"), "Config")
        with tree.open(config_name) as stream:
            config = read_bounded(read_chunks(stream), limits.limit("max_document_bytes"), "the image config")
        config_digest = _digest_of_name(config_name)
        if config_digest:
            verify_digest(config, config_digest, "the image config")
        layer_names = entry.get("Layers")
        if not isinstance(layer_names, list):
            raise ImagePullFailed(f"{path}: manifest.json has no Layers list")
        layers = [
            Descriptor(
                media_type="",
                digest=_digest_of_name(name) or "",
                size=tree.size(name),
                annotations={MEMBER: name},
            )
            for name in (_name(n, "Layers") for n in layer_names)
        ]
        digest = sha256_digest(config)
        manifest = Manifest(Descriptor(DOCKER_CONFIG, digest, len(config), annotations={}), layers)
        progress(f"loading {path} ({digest})")
        return assemble(
            _PreloadedConfig(_ArchiveBlobs(tree), digest, config),
            manifest,
            name=f"{path}{':' + ref if ref else ''}",
            digest=digest,
            dest=dest,
            limits=limits,
            progress=progress,
            platform=platform,
        )


class _PreloadedConfig:
    """The archive's blobs, with the config (already read, to find its digest) served from memory."""

    def __init__(self, inner: _ArchiveBlobs, digest: str, config: bytes) -> None:
        self._inner = inner
        self._digest = digest
        self._config = config

    @contextlib.contextmanager
    def open_blob(self, descriptor: Descriptor, what: str) -> Iterator[Iterable[bytes]]:
        if descriptor.digest == self._digest and MEMBER not in descriptor.annotations:
            yield [self._config]
            return
        with self._inner.open_blob(descriptor, what) as chunks:
            yield chunks


def _json_list(raw: bytes) -> list[dict[str, Any]]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImagePullFailed(f"manifest.json is not valid JSON: {exc}") from exc
    if not isinstance(doc, list) or not all(isinstance(e, dict) for e in doc) or not doc:
        raise ImagePullFailed("manifest.json is not a non-empty list of images")
    return doc


def _entry(entries: list[dict[str, Any]], ref: str | None, path: Path) -> dict[str, Any]:
    if ref is None:
        if len(entries) != 1:
            raise ImagePullFailed(f"{path} holds {len(entries)} images: name one of their RepoTags")
        return entries[0]
    want = str(parse_reference(ref))
    for entry in entries:
        for tag in entry.get("RepoTags") or []:
            with contextlib.suppress(InvalidArgument):
                if str(parse_reference(str(tag))) == want:
                    return entry
    tags = sorted(str(t) for e in entries for t in e.get("RepoTags") or [])
    raise ImagePullFailed(f"{path} has no image tagged {ref!r} (it has: {', '.join(tags) or 'no tags'})")


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ImagePullFailed(f"manifest.json: {field} holds {value!r}, not a file name")
    return value


def _digest_of_name(name: str) -> str | None:
    """``sha256:<hex>`` for a file named by its digest (``<hex>.json``, ``blobs/sha256/<hex>``), else None."""
    match = _DIGEST_NAME.search(name)
    return f"sha256:{match.group(1)}" if match and not name.endswith("/layer.tar") else None


__all__ = ["load_docker_archive"]
