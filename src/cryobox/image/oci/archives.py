"""An image archive a user uploads, whichever kind it is: a ``docker save`` tar (``manifest.json``; Docker 25's
also holds an OCI layout, read through its ``manifest.json``) or a tar of an OCI image layout (``oci-layout`` and
``index.json`` at its top, as ``skopeo copy … oci-archive:`` or ``tar -C layout -cf x.tar .`` write it).

:func:`archive_kind` tells them apart from the tar's member names alone (a control plane checks an upload with it
before storing anything); :func:`load_archive` reads either in place (:func:`.load_docker_archive`,
:func:`.load_layout`) into the same :class:`.PulledImage` a pull gives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from ...errors import ImagePullFailed
from .dockerarchive import load_docker_archive
from .layout import load_layout
from .limits import ImageLimits
from .manifest import DEFAULT_PLATFORM
from .pulled import PulledImage
from .trees import TarTree

ArchiveKind = Literal["docker-save", "oci-layout"]


def archive_kind(path: Path) -> ArchiveKind:
    """Which kind of image archive ``path`` is (a plain or compressed tar).

    :raises ImagePullFailed: not a readable tar, or neither kind (the message says what each needs)."""
    with TarTree(path) as tree:
        if tree.exists("manifest.json"):
            return "docker-save"
        if tree.exists("oci-layout") and tree.exists("index.json"):
            return "oci-layout"
    raise ImagePullFailed(
        "not an image archive: a docker save tar has manifest.json at its top, "
        "an OCI layout tar has oci-layout and index.json at its top"
    )


def load_archive(
    path: Path,
    dest: Path,
    *,
    limits: ImageLimits,
    progress: Callable[[str], None],
    ref: str | None = None,
    platform: str = DEFAULT_PLATFORM,
) -> PulledImage:
    """The image in the archive at ``path`` (``ref`` names it when the archive holds several) as plain layer tars
    in ``dest``."""
    kind = archive_kind(path)
    load = load_docker_archive if kind == "docker-save" else load_layout
    return load(path, dest, limits=limits, progress=progress, ref=ref, platform=platform)


__all__ = ["ArchiveKind", "archive_kind", "load_archive"]
