"""From a manifest to plain layer tars, whatever the blobs come from (a registry, a layout, an archive).

Every layer is fetched to a file (checked against its digest and its compressed limit), unpacked to a plain tar
(checked against its uncompressed limit and, by its diff ID, against the config), and the compressed blob is
dropped. With a :class:`~cryobox.image.cache.ContentCache`, unpacked layers and configs are kept by digest
(complete or absent: a build directory renamed into place) and hard-linked into the destination, so a second pull
of the same layers downloads nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...errors import ImagePullFailed
from ..cache import ContentCache
from .blobs import mismatch, read_bounded, verify_digest, write_blob
from .decompress import decompress_layer
from .imageconfig import read_image_config
from .limits import ByteLimit, ImageLimits, tightest
from .manifest import Descriptor, Manifest, check_config
from .pulled import PulledImage

LAYER_KIND = "oci-layer"
CONFIG_KIND = "oci-config"
LAYER_FILE = "layer.tar"
DIFF_ID_FILE = "diff_id"
BLOB_FILE = "blob"


class BlobSource(Protocol):
    def open_blob(self, descriptor: Descriptor, what: str) -> AbstractContextManager[Iterable[bytes]]:
        """The blob's bytes, in chunks (checked by the caller, not by the source)."""
        ...


@dataclass
class _Tally:
    downloaded: int = 0


def assemble(
    source: BlobSource,
    manifest: Manifest,
    *,
    name: str,
    digest: str,
    dest: Path,
    limits: ImageLimits,
    progress: Callable[[str], None],
    cache: ContentCache | None = None,
    platform: str = "",
    index_digest: str = "",
) -> PulledImage:
    """Fetch and unpack ``manifest``'s layers into ``dest``; ``platform``: what the config must say, if anything."""
    limits.check_layer_count(len(manifest.layers))
    check_config(manifest.config)
    per_layer = limits.limit("max_layer_compressed_bytes")
    total = limits.limit("max_total_bytes")
    for n, layer in enumerate(manifest.layers, 1):
        per_layer.check(layer.size, f"layer {n} ({layer.digest}, {layer.size} bytes as declared)")
    compressed = sum(layer.size for layer in manifest.layers)
    total.check(compressed, f"the image's layers ({compressed} bytes compressed, as declared)")
    tally = _Tally()
    facts = read_image_config(_config(source, manifest.config, limits, cache, tally))
    if len(facts.diff_ids) != len(manifest.layers):
        raise ImagePullFailed(
            f"the image's config lists {len(facts.diff_ids)} layers, its manifest {len(manifest.layers)}"
        )
    if platform and facts.platform.split("/")[:2] != platform.split("/")[:2]:
        raise ImagePullFailed(f"the image is {facts.platform}, not {platform}", details={"platform": facts.platform})
    dest.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    used = 0
    for n, (layer, diff_id) in enumerate(zip(manifest.layers, facts.diff_ids, strict=True), 1):
        what = f"layer {n}/{len(manifest.layers)} ({layer.digest or diff_id})"
        unpacked = tightest(limits.limit("max_layer_bytes"), total.after(used))
        target = dest / f"{n:03d}-{diff_id.removeprefix('sha256:')[:16]}.tar"
        size = _layer(source, layer, diff_id, target, limits, unpacked, cache, tally, what, progress)
        used += size
        paths.append(target)
    progress(f"{name}: {len(paths)} layers, {used} bytes unpacked, {tally.downloaded} bytes downloaded")
    return PulledImage(
        source=name,
        digest=digest,
        platform=facts.platform,
        config=facts.config,
        layers=paths,
        diff_ids=list(facts.diff_ids),
        compressed_bytes=compressed,
        uncompressed_bytes=used,
        downloaded_bytes=tally.downloaded,
        index_digest=index_digest,
    )


def _config(
    source: BlobSource, config: Descriptor, limits: ImageLimits, cache: ContentCache | None, tally: _Tally
) -> bytes:
    limit = limits.limit("max_document_bytes")

    def fetch() -> bytes:
        with source.open_blob(config, "the image config") as chunks:
            data = read_bounded(chunks, limit, "the image config")
        tally.downloaded += len(data)
        verify_digest(data, config.digest, "the image config")
        return data

    if cache is None:
        return fetch()

    def build(into: Path) -> None:
        (into / BLOB_FILE).write_bytes(fetch())

    path, _ = cache.get_or_build(CONFIG_KIND, {"digest": config.digest}, build)
    return (path / BLOB_FILE).read_bytes()


def _layer(
    source: BlobSource,
    layer: Descriptor,
    diff_id: str,
    target: Path,
    limits: ImageLimits,
    unpacked: ByteLimit,
    cache: ContentCache | None,
    tally: _Tally,
    what: str,
    progress: Callable[[str], None],
) -> int:
    def build(into: Path) -> None:
        progress(f"{what}: fetching {layer.size} bytes")
        blob = into / BLOB_FILE
        with source.open_blob(layer, what) as chunks:
            tally.downloaded += write_blob(
                chunks, blob, layer.digest or None, limit=limits.limit("max_layer_compressed_bytes"), what=what
            )
        result = decompress_layer(blob, into / LAYER_FILE, media_type=layer.media_type, limit=unpacked, what=what)
        blob.unlink()
        if result.diff_id != diff_id:
            raise mismatch(f"{what} unpacked", diff_id, result.diff_id)
        (into / DIFF_ID_FILE).write_text(result.diff_id)

    if cache is None or not layer.digest:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".layer-") as tmp:
            build(Path(tmp))
            os.replace(Path(tmp) / LAYER_FILE, target)
        return target.stat().st_size
    path, built = cache.get_or_build(LAYER_KIND, {"digest": layer.digest}, build)
    if not built:
        progress(f"{what}: cached")
    if (path / DIFF_ID_FILE).read_text() != diff_id:
        raise mismatch(f"{what} (cached)", diff_id, (path / DIFF_ID_FILE).read_text())
    size = (path / LAYER_FILE).stat().st_size
    unpacked.check(size, f"{what} unpacked ({size} bytes)")
    _link(path / LAYER_FILE, target)
    return size


def _link(src: Path, target: Path) -> None:
    """Hard-link a cached tar into place (the cache and the destination share a filesystem), else copy it."""
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    try:
        os.link(src, target)
    except OSError:
        shutil.copyfile(src, target)


__all__ = ["BlobSource", "assemble"]
