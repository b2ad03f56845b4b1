"""Where a recipe build starts: a Debian or template root filesystem as it is, or an OCI image's layers.

* ``debian`` (bookworm) and ``template`` bases are raw ext4 images already on this host; the first step's layer
  goes over them.
* ``image`` bases are pulled on the host (:mod:`cryobox.image.oci`: the host moves and verifies bytes, never
  unpacks), and unpacked by the build VM onto an empty ext4 (``emptyfs``, made by the host from nothing) as the
  build's ``base`` phase, whose result is cached like a step (keyed by the image's manifest digest). ``scratch``
  is the empty image.
* ``archive`` bases (an uploaded ``docker save`` tar or OCI layout tar) are fetched from the object store (where
  the control plane keeps them like context blobs, verified against their SHA-256), read in place into the same
  plain layer tars (:func:`cryobox.image.oci.load_archive`), and from there on are an ``image`` base (the same
  cache key for the same image: its manifest digest, or a legacy ``docker save``'s config digest).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import IntegrityError, InvalidArgument, StateError
from ...image.builder import ImageSet, build_images
from ...image.cache import ContentCache
from ...image.oci import ImageLimits, PulledImage, RegistrySettings, load_archive, pull_image
from ...image.recipe.model import ImageConfig, Recipe
from ...image.rootfs import ROOT_LABEL
from ...image.specs import by_name
from ...objstore import keys
from ...objstore.client import ObjectStore
from ...util.proc import Progress

BUILD_FORMAT = 1
TARGET_BYTES = 8 << 30
"""The virtual size of a built image's disk (sparse; the filesystem is grown to it in the build VM)."""
FS_UUID = "c2b0b0c5-0000-4000-8000-000000000001"
FS_TIME = 1_700_000_000
"""The empty filesystem's UUID, hash seed and timestamps (it must be the same bytes on every host)."""


@dataclass(frozen=True)
class BaseImage:
    key: str
    image: Path
    """A raw ext4 the first layer goes over (for an ``image`` base: the empty filesystem)."""
    config: ImageConfig | None
    description: str
    layers: tuple[Path, ...] | None = None
    """An ``image`` base's layers (plain tars, in order) the build VM unpacks in the ``base`` phase."""
    cleanup: Callable[[], None] = field(default=lambda: None)


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def empty_fs(images_dir: Path) -> Path:
    """An empty ext4 of :data:`TARGET_BYTES` (sparse), the base of every image unpack. Made reproducibly (a fixed
    UUID, hash seed and time), so hosts with the same mke2fs hold the same bytes and share the step layers built
    over it through the object store (:mod:`.storelayers` checks the content)."""

    def build(out: Path) -> None:
        image = out / "rootfs.ext4"
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-L", ROOT_LABEL, "-U", FS_UUID, "-E", f"hash_seed={FS_UUID}"]
            + [str(image), f"{TARGET_BYTES >> 20}M"],
            check=True,
            capture_output=True,
            env={**os.environ, "E2FSPROGS_FAKE_TIME": str(FS_TIME)},
        )
        image.chmod(0o444)

    params = {"bytes": TARGET_BYTES, "label": ROOT_LABEL, "uuid": FS_UUID, "time": FS_TIME}
    path, _ = ContentCache(images_dir).get_or_build("emptyfs", params, build)
    return path / "rootfs.ext4"


def fetch_archive_image(
    store: ObjectStore, sha256: str, name: str, work: Path, *, limits: ImageLimits, progress: Progress
) -> PulledImage:
    """The image in the archive blob ``sha256`` (``name`` picks one of several) as plain layer tars in ``work``;
    the downloaded archive is deleted once read."""
    archive = work / f"archive-{sha256[:16]}.tar"

    def verify(size: int, actual: str) -> None:
        if actual != sha256:
            raise IntegrityError(f"image archive {sha256} downloaded as {actual}", details={"hash": sha256})

    progress(f"fetching the image archive {sha256[:12]}")
    store.download(keys.build_context(sha256), archive, verify=verify)
    try:
        return load_archive(archive, work, limits=limits, progress=progress, ref=name or None)
    finally:
        archive.unlink(missing_ok=True)


async def resolve_base(
    recipe: Recipe,
    *,
    images_dir: Path,
    os_images: ImageSet,
    work: Path,
    template_rootfs: Callable[[str], Path | None],
    progress: Progress,
    store: ObjectStore | None = None,
) -> BaseImage:
    """The base of ``recipe`` on this host (pulling an image's layers, or reading an archive's, into ``work``;
    an ``archive`` base needs ``store``)."""
    kind, ref = recipe.base.kind, recipe.base.ref
    if kind == "debian":
        if ref != "bookworm":
            raise InvalidArgument(f"Debian {ref!r} is not a base cryobox builds (bookworm is)", details={"base": ref})
        image = os_images.rootfs.image
        return BaseImage(digest(str(BUILD_FORMAT), "rootfs", image.parent.name), image, None, "Debian bookworm")
    if kind == "template":
        builtin = by_name(ref)
        if builtin is not None and not builtin.added_packages and not builtin.added_pip:
            images = await asyncio.to_thread(build_images, images_dir, builtin, progress)
            image = images.rootfs.image
        else:
            found = template_rootfs(ref)
            if found is None:
                raise InvalidArgument(f"no template {ref!r} to build from on this agent", details={"template": ref})
            image = found
        return BaseImage(digest(str(BUILD_FORMAT), "rootfs", str(image)), image, None, f"template {ref}")
    if kind == "archive" and store is None:
        raise StateError("an image archive base needs the object store", state="no_store", required="store")
    empty = await asyncio.to_thread(empty_fs, images_dir)
    if kind == "image" and ref == "scratch":
        return BaseImage(digest(str(BUILD_FORMAT), "scratch"), empty, None, "scratch", layers=())
    work.mkdir(parents=True, exist_ok=True)
    limits = ImageLimits.from_env()
    if kind == "archive" and store is not None:
        name = recipe.base.name
        pulled = await asyncio.to_thread(fetch_archive_image, store, ref, name, work, limits=limits, progress=progress)
        source = f"archive {ref[:12]}" + (f" ({name})" if name else "")
        progress(f"loaded {source} ({pulled.digest[:19]}, {len(pulled.layers)} layers)")
    else:
        settings = RegistrySettings.from_env(cache_dir=images_dir / "oci")
        pulled = await asyncio.to_thread(pull_image, ref, work, settings=settings, limits=limits, progress=progress)
        source = ref
        progress(
            f"pulled {ref} ({pulled.digest[:19]}, {len(pulled.layers)} layers, "
            f"{pulled.uncompressed_bytes >> 20} MiB unpacked, {pulled.downloaded_bytes >> 20} MiB downloaded)"
        )
    return BaseImage(
        digest(str(BUILD_FORMAT), "image", pulled.digest),
        empty,
        pulled.config,
        f"{source} ({pulled.digest})",
        layers=tuple(pulled.layers),
    )


__all__ = ["BUILD_FORMAT", "TARGET_BYTES", "BaseImage", "digest", "empty_fs", "fetch_archive_image", "resolve_base"]
