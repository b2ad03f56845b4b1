"""Hibernation images in the object store, so a sandbox hibernated on one host can wake on another.

Same chunked format as a snapshot (:func:`.publish.publish_snapshot`), under the sandbox's id::

    hibernations/<sandbox id>/memory.idx, vmstate, disk.qcow2   (the overlay over its template's disk; the
                                                                memory's chunks are shared ``chunks/`` objects)
    hibernations/<sandbox id>/manifest.json                      written last; pins every object above

One image per sandbox: a later hibernation (another image id) replaces the stored one. An import brings the
whole image home, memory included (downloaded and verified chunk by chunk), so the woken VM maps a local copy
and the stored objects can be deleted as soon as its row names its new host. Every object is checked against
its pin in the manifest (:mod:`.pins`) before it is renamed into place or parsed, and the manifest against the
sha256 the registry pins for it (:mod:`.manifests`) before it is parsed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from ...errors import ObjectNotFound, StateError
from ...objstore.client import ObjectStore
from ...objstore.images import download_image
from ...objstore.leases import DEFAULT_TIMING, LeaseTiming
from ...objstore.manifests import Published, fetch_manifest, put_manifest, still_published
from ...objstore.pins import PINS_FIELD, PinSet
from ...util.files import fsync_dir, write_json_atomic
from ..snapshot.store import SnapshotImage
from ..templates.bake import Template
from .templates import (
    LAYOUT_VERSION,
    _backing_file,
    _rebase,
    fetch_image_files,
    memory_summary,
    template_prefix,
    upload_captured,
)


def hibernation_prefix(sandbox_id: str) -> str:
    return f"hibernations/{sandbox_id}"


def stored_manifest(store: ObjectStore, sandbox_id: str) -> dict[str, Any] | None:
    try:
        manifest: dict[str, Any] = json.loads(store.get(f"{hibernation_prefix(sandbox_id)}/manifest.json"))
    except ObjectNotFound:
        return None
    return manifest


def publish_hibernation(
    store: ObjectStore,
    sandbox_id: str,
    image: SnapshotImage,
    template: Template,
    work_dir: Path,
    *,
    timing: LeaseTiming = DEFAULT_TIMING,
) -> Published:
    """Upload ``sandbox_id``'s hibernation ``image`` (over ``template``'s disk); the manifest goes last, and the
    sha256 of its bytes is returned (the registry pins it). Idempotent: nothing is uploaded while the store holds
    the manifest this image was published with; another image of the sandbox is replaced (its chunks stay until
    ``cryobox gc --store`` finds them unreferenced). ``work_dir`` is no longer used."""
    if Path(_backing_file(image.disk)) != template.disk:
        raise StateError(
            f"the hibernation of {sandbox_id} is not over the current generation of template {template.name} "
            f"({template.generation}); it cannot move to another host",
            details={"id": sandbox_id, "template": template.name},
        )
    prefix = hibernation_prefix(sandbox_id)
    done = still_published(store, f"{prefix}/manifest.json", image.path)
    if done is not None:
        return Published(prefix, done)
    found = stored_manifest(store, sandbox_id)
    if found is not None and found.get("id") != image.id:
        delete_hibernation(store, sandbox_id)  # an earlier hibernation of the same sandbox
    index, pins = upload_captured(store, prefix, image, template, timing)
    manifest = dict(image.manifest)
    manifest.update(
        id=image.id,
        layout=LAYOUT_VERSION,
        template_generation=template.generation,
        template_prefix=template_prefix(template.name, template.generation),
        memory_chunks=memory_summary(index),
        published_at=time.time(),
    )
    manifest[PINS_FIELD] = pins.to_json()
    return Published(prefix, put_manifest(store, f"{prefix}/manifest.json", manifest, image.path))


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
    prefix = hibernation_prefix(sandbox_id)
    manifest, _ = fetch_manifest(
        store, f"{prefix}/manifest.json", manifest_sha256, f"the manifest of the hibernation of {sandbox_id}"
    )
    if (manifest.get("template"), manifest.get("template_generation")) != (template.name, template.generation):
        raise StateError(
            f"the hibernation of {sandbox_id} is of template {manifest.get('template')} "
            f"({manifest.get('template_generation')}); this host serves {template.name} ({template.generation})",
            details={"id": sandbox_id},
        )
    pins = PinSet.from_manifest(manifest, f"the manifest of the hibernation of {sandbox_id}")
    image_id = f"{sandbox_id}.h{secrets.token_hex(4)}"
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".{image_id}.import"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        fetch_image_files(store, prefix, work, pins)
        _rebase(work / "disk.qcow2", template.disk, "qcow2")
        download_image(store, f"{prefix}/memory", work / "memory", pins)
        machine = dict(manifest["machine"], kernel=str(template.machine.kernel), initrd=str(template.machine.initrd))
        manifest.update(id=image_id, machine=machine, imported_from=store.url, imported_at=time.time())
        write_json_atomic(work / "manifest.json", manifest)
        os.replace(work, root / image_id)
        fsync_dir(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return image_id


def delete_hibernation(store: ObjectStore, sandbox_id: str) -> list[str]:
    """Remove a stored hibernation, the manifest first (a half-deleted one never looks whole); idempotent."""
    keys = store.list(hibernation_prefix(sandbox_id))
    for key in sorted(keys, key=lambda k: not k.endswith("/manifest.json")):
        with contextlib.suppress(ObjectNotFound):
            store.delete(key)
    return keys
