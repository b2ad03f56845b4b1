"""``load_layout``: an image from an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/…``), a
directory or a tar of one (``skopeo copy … oci-archive:``), read in place.

``index.json`` may list several images: ``ref`` picks one by its ``org.opencontainers.image.ref.name`` annotation
(the tag skopeo and buildah write); without ``ref`` a layout must hold one image (or one index, resolved to
``platform``). Nothing but the layer tars is written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ...errors import ImagePullFailed
from .assemble import assemble
from .blobs import read_bounded, read_chunks, verify_digest
from .limits import ImageLimits
from .manifest import DEFAULT_PLATFORM, Descriptor, Index, Manifest, parse_document, select_platform
from .mediatypes import INDEXES
from .pulled import PulledImage
from .trees import DirTree, TarTree, Tree

REF_NAME = "org.opencontainers.image.ref.name"
MAX_INDEX_DEPTH = 2


class TreeBlobs:
    """Blobs of a layout by digest (``blobs/sha256/<hex>``)."""

    def __init__(self, tree: Tree, prefix: str = "") -> None:
        self.tree = tree
        self.prefix = prefix

    def name(self, digest: str) -> str:
        algorithm, _, hexdigest = digest.partition(":")
        return f"{self.prefix}blobs/{algorithm}/{hexdigest}"

    @contextlib.contextmanager
    def open_blob(self, descriptor: Descriptor, what: str) -> Iterator[Iterable[bytes]]:
        with self.tree.open(self.name(descriptor.digest)) as stream:
            yield read_chunks(stream)

    def document(self, descriptor: Descriptor, limits: ImageLimits, what: str) -> bytes:
        with self.open_blob(descriptor, what) as chunks:
            data = read_bounded(chunks, limits.limit("max_document_bytes"), what)
        verify_digest(data, descriptor.digest, what)
        return data


def load_layout(
    path: Path,
    dest: Path,
    *,
    limits: ImageLimits,
    progress: Callable[[str], None],
    ref: str | None = None,
    platform: str = DEFAULT_PLATFORM,
) -> PulledImage:
    """The image of the layout at ``path`` (a directory, or a tar archive of one) unpacked to tars in ``dest``."""
    if path.is_dir():
        return load_layout_tree(DirTree(path), dest, limits=limits, progress=progress, ref=ref, platform=platform)
    with TarTree(path) as tree:
        return load_layout_tree(tree, dest, limits=limits, progress=progress, ref=ref, platform=platform)


def load_layout_tree(
    tree: Tree,
    dest: Path,
    *,
    limits: ImageLimits,
    progress: Callable[[str], None],
    ref: str | None,
    platform: str,
    label: str = "",
) -> PulledImage:
    label = label or getattr(tree, "label", "an OCI layout")
    if not tree.exists("oci-layout") or not tree.exists("index.json"):
        raise ImagePullFailed(f"{label} is not an OCI image layout (no oci-layout or index.json)")
    blobs = TreeBlobs(tree)
    with tree.open("index.json") as stream:
        top = parse_document(read_bounded(read_chunks(stream), limits.limit("max_document_bytes"), "index.json"))
    if not isinstance(top, Index):
        raise ImagePullFailed(f"{label}: index.json is not an image index")
    entry = _entry(top, ref, platform, label)
    index_digest = ""
    doc: Index | Manifest = Index([entry])
    for _ in range(MAX_INDEX_DEPTH + 1):
        data = blobs.document(entry, limits, f"manifest {entry.digest}")
        doc = parse_document(data, entry.media_type)
        if isinstance(doc, Manifest):
            break
        index_digest = index_digest or entry.digest
        entry = select_platform(doc, platform)
    if not isinstance(doc, Manifest):
        raise ImagePullFailed(f"{label}: indexes nested too deep")
    progress(f"loading {label} ({entry.digest})")
    return assemble(
        blobs,
        doc,
        name=f"{label}{':' + ref if ref else ''}",
        digest=entry.digest,
        dest=dest,
        limits=limits,
        progress=progress,
        platform=platform,
        index_digest=index_digest,
    )


def _entry(top: Index, ref: str | None, platform: str, label: str) -> Descriptor:
    if ref is not None:
        named = [m for m in top.manifests if m.annotations.get(REF_NAME) == ref]
        if not named:
            names = sorted({m.annotations.get(REF_NAME, "") for m in top.manifests} - {""})
            raise ImagePullFailed(f"{label} has no image named {ref!r} (it has: {', '.join(names) or 'no names'})")
        return named[0] if len(named) == 1 else select_platform(Index(named), platform)
    if len(top.manifests) == 1:
        return top.manifests[0]
    if top.manifests and all(m.platform for m in top.manifests if m.media_type not in INDEXES):
        return select_platform(top, platform)
    raise ImagePullFailed(f"{label} holds {len(top.manifests)} images: name one (its ref.name annotation)")


__all__ = ["TreeBlobs", "load_layout", "load_layout_tree"]
