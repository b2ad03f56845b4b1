"""Hibernation images in the object store, so a sandbox hibernated on one host can wake on another.

The snapshot path (:mod:`.images`, as :func:`.templates.publish_snapshot` takes it) under the sandbox's id::

    hibernations/<sandbox id>/memory.idx, vmstate, disk.qcow2   (the overlay over its template's disk; the
                                                                memory's chunks are shared ``chunks/`` objects)
    hibernations/<sandbox id>/manifest.json                      written last; pins every object above

One image per sandbox: a later hibernation (another image id) replaces the stored one. An import brings the
whole image home, memory included (downloaded and verified chunk by chunk), so the woken VM maps a local copy
and the stored objects can be deleted as soon as its row names its new host. Every object is checked against
its pin in the manifest (:mod:`cryobox.objstore.pins`) before it is renamed into place or parsed, and the
manifest against the sha256 the registry pins for it (:mod:`cryobox.objstore.manifests`) before it is parsed.
A sandbox with volumes records them in the manifest, slot by slot (the volumes themselves move through
``volumes/<id>/``, driven by the control plane, before the wake).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...objstore.client import ObjectStore
from ...objstore.keys import hibernation_prefix
from ...objstore.leases import DEFAULT_TIMING, LeaseTiming
from ...objstore.manifests import Published, delete_published
from ..snapshot.store import SnapshotImage
from ..templates.bake import Template
from ..vm.volumes import AttachedVolume
from . import images
from .images import StoredImage, import_image, publish_image

VOLUMES_FIELD = "volumes"
"""The manifest's list of the sandbox's attached volumes (:func:`portable_volumes`)."""


def hibernation_image(sandbox_id: str) -> StoredImage:
    """A sandbox's hibernation in the store: ``hibernations/<sandbox id>``, one image at a time, imported whole."""
    return StoredImage(
        prefix=hibernation_prefix(sandbox_id),
        subject=f"the hibernation of {sandbox_id}",
        ident=sandbox_id,
        unpublishable="it cannot move to another host",
        one_image=True,
        memory_home=True,
    )


def stored_manifest(store: ObjectStore, sandbox_id: str) -> dict[str, Any] | None:
    return images.stored_manifest(store, hibernation_prefix(sandbox_id))


def publish_hibernation(
    store: ObjectStore,
    sandbox_id: str,
    image: SnapshotImage,
    template: Template,
    *,
    volumes: Sequence[Mapping[str, Any]] = (),
    timing: LeaseTiming = DEFAULT_TIMING,
) -> Published:
    """Upload ``sandbox_id``'s hibernation ``image`` (over ``template``'s disk); the manifest goes last, and the
    sha256 of its bytes is returned (the registry pins it). ``volumes``: the sandbox's attached volumes, slot by
    slot (:func:`portable_volumes`), recorded in the manifest so that a wake elsewhere points the same slots at
    them. Idempotent: nothing is uploaded while the store holds the manifest this image was published with;
    another image of the sandbox is replaced (its chunks stay until ``cryobox gc --store`` finds them
    unreferenced)."""
    extra = {VOLUMES_FIELD: [dict(v) for v in volumes]} if volumes else None
    return publish_image(store, hibernation_image(sandbox_id), image, template, timing, extra)


def portable_volumes(volumes: Sequence[AttachedVolume]) -> list[dict[str, Any]]:
    """What a stored hibernation records of its sandbox's volumes: each slot's volume, without this host's path
    (``name`` is the volume id)."""
    return [{k: v for k, v in volume.to_json().items() if k != "path"} for volume in volumes]


def stored_volumes(manifest: Mapping[str, Any], path: Callable[[str], Path]) -> tuple[AttachedVolume, ...]:
    """The volumes a stored hibernation's sandbox had (:func:`portable_volumes`), at this host's ``path`` of each
    volume id."""
    return tuple(AttachedVolume.from_json({**v, "path": str(path(v["name"]))}) for v in manifest.get(VOLUMES_FIELD, ()))


def import_hibernation(
    store: ObjectStore, sandbox_id: str, root: Path, template: Template, manifest_sha256: str | None = None
) -> str:
    """Bring ``sandbox_id``'s stored hibernation home as ``root/<new image id>/`` (memory, vmstate, the overlay
    rebased onto this host's copy of ``template``'s disk, manifest last); returns the image id. The manifest must
    hash to ``manifest_sha256`` (the registry's pin; ``None``: a row from before manifests were pinned, accepted
    with a warning) before it is parsed.

    :raises ObjectNotFound: nothing is stored for ``sandbox_id``.
    :raises IntegrityError: the manifest is not the pinned one (or an object not the one it pins).
    :raises StateError: it sits on another template or generation than the one this host serves.
    """
    image_id = f"{sandbox_id}.h{secrets.token_hex(4)}"
    import_image(store, hibernation_image(sandbox_id), root / image_id, template, manifest_sha256)
    return image_id


def delete_hibernation(store: ObjectStore, sandbox_id: str) -> list[str]:
    """Remove a stored hibernation, the manifest first (a half-deleted one never looks whole); idempotent."""
    return delete_published(store, hibernation_prefix(sandbox_id))
