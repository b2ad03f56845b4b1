"""OCI images on the host: pulled from a registry or read from a local layout or ``docker save`` archive, down to
plain layer tars and an :class:`~cryobox.image.recipe.model.ImageConfig`. The host only moves bytes: it never
unpacks a layer's files (a build VM does)."""

from .archives import ArchiveKind, archive_kind, load_archive
from .dockerarchive import load_docker_archive
from .layout import load_layout
from .limits import ImageLimits
from .pull import pull_image
from .pulled import PulledImage
from .reference import Reference, parse_reference
from .settings import RegistrySettings

__all__ = [
    "ArchiveKind",
    "ImageLimits",
    "PulledImage",
    "Reference",
    "RegistrySettings",
    "archive_kind",
    "load_archive",
    "load_docker_archive",
    "load_layout",
    "parse_reference",
    "pull_image",
]
