"""The media types of OCI and Docker images, and how a layer is compressed (its media type and magic bytes)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from ...errors import ImagePullFailed

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_LAYER_NONDIST = "application/vnd.oci.image.layer.nondistributable.v1.tar"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_ZSTD = "application/vnd.docker.image.rootfs.diff.tar.zstd"
DOCKER_FOREIGN_LAYER = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
DOCKER_SCHEMA1 = (
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
)

INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
CONFIGS = (OCI_CONFIG, DOCKER_CONFIG)
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
"""The ``Accept`` header of a manifest request: both indexes, both manifests (never schema 1)."""

Compression = Literal["gzip", "zstd", "none"]

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_LAYERS: Mapping[str, Compression] = MappingProxyType(
    {
        OCI_LAYER: "none",
        OCI_LAYER_NONDIST: "none",
        OCI_LAYER_GZIP: "gzip",
        OCI_LAYER_ZSTD: "zstd",
        OCI_LAYER_NONDIST + "+gzip": "gzip",
        OCI_LAYER_NONDIST + "+zstd": "zstd",
        DOCKER_LAYER: "none",
        DOCKER_LAYER_GZIP: "gzip",
        DOCKER_LAYER_ZSTD: "zstd",
        DOCKER_FOREIGN_LAYER: "gzip",
    }
)


def declared_compression(media_type: str) -> Compression | None:
    """What a layer's media type says about its compression; None for a type that says nothing (an empty one, or
    a ``docker save`` archive's layer). A type that is not a layer (an encrypted one, say) is refused."""
    if not media_type:
        return None
    try:
        return _LAYERS[media_type]
    except KeyError:
        raise ImagePullFailed(
            f"unsupported layer media type {media_type!r}", details={"media_type": media_type}
        ) from None


def sniffed_compression(head: bytes) -> Compression:
    """What a layer's first bytes say: gzip, zstd, or neither (a plain tar, or not a layer at all)."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


def layer_compression(media_type: str, head: bytes) -> Compression:
    """How to unpack a layer. The magic bytes decide (as Docker's own unpacker does: registries exist that label a
    plain tar ``tar.gzip``); a layer whose type promises compression but whose bytes have no known magic is
    refused rather than taken for a tar."""
    declared = declared_compression(media_type)
    sniffed = sniffed_compression(head)
    if declared not in (None, "none") and sniffed == "none":
        raise ImagePullFailed(
            f"a layer of type {media_type!r} does not start like {declared} data", details={"media_type": media_type}
        )
    return sniffed


__all__ = [
    "ACCEPT",
    "CONFIGS",
    "Compression",
    "INDEXES",
    "MANIFESTS",
    "declared_compression",
    "layer_compression",
    "sniffed_compression",
]
