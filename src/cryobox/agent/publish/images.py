"""A captured image (a snapshot or a hibernation) ↔ its objects under one store prefix.

One path for both kinds: under ``<prefix>/`` (``snapshots/<id>``, ``hibernations/<sandbox id>``) a publish puts
``memory.idx`` (the memory's chunks the store lacks go to the shared ``chunks/``), ``vmstate``, ``disk.qcow2``
(the overlay over its template's disk) and, last, ``manifest.json``, which pins every object above and names the
template generation; the registry pins the manifest's sha256. An import checks the manifest against that pin and
every object against its pin before it is renamed into place or parsed, rebases the overlay onto this host's
copy of the template's disk and writes the local manifest last.

The kinds differ only in what :class:`StoredImage` declares: how messages name the image, whether the prefix
holds one image at a time (a sandbox's later hibernation replaces the stored one), and whether an import brings
the memory home (a hibernation: its stored objects go once it wakes) or leaves it to be paged from the store (a
snapshot: its local manifest names the prefix, ``memory_prefix``, and records the manifest it came from).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ObjectNotFound, StateError
from ...objstore.chunkfmt import ChunkIndex, scan_image
from ...objstore.client import ObjectStore
from ...objstore.images import download_image, upload_image
from ...objstore.keys import LAYOUT_VERSION, template_prefix
from ...objstore.leases import LeaseTiming, PublishLease
from ...objstore.manifests import (
    Published,
    delete_published,
    fetch_manifest,
    put_manifest,
    record_manifest,
    still_published,
)
from ...objstore.pins import PINS_FIELD, PinSet
from ...util.files import fsync_dir, write_json_atomic
from ..snapshot.store import SnapshotImage
from ..templates.bake import Template


@dataclass(frozen=True)
class StoredImage:
    """Where a captured image lives in the store, and the ways its kind differs."""

    prefix: str
    subject: str
    """How messages name it: ``snapshot snap-1``, ``the hibernation of sb-1``."""
    ident: str
    """The id its errors carry in their details."""
    unpublishable: str
    """What a refusal to publish an image over an older template generation adds."""
    one_image: bool = False
    """The prefix holds one image at a time: publishing another (another ``id`` in its manifest) replaces it."""
    memory_home: bool = False
    """An import downloads the memory (the stored objects may go); else the memory is paged from the store."""

    @property
    def manifest_key(self) -> str:
        return f"{self.prefix}/manifest.json"


def stored_manifest(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    """The manifest under ``prefix`` as stored (not checked against any pin), or ``None``."""
    try:
        manifest: dict[str, Any] = json.loads(store.get(f"{prefix}/manifest.json"))
    except ObjectNotFound:
        return None
    return manifest


def backing_file(disk: Path) -> str:
    out = subprocess.run(
        ["qemu-img", "info", "--output=json", "-U", str(disk)], check=True, capture_output=True, text=True
    )
    return str(json.loads(out.stdout).get("backing-filename") or "")


def rebase(disk: Path, backing: Path, backing_format: str) -> None:
    """Point a downloaded overlay at this host's copy of its backing file (metadata only: ``-u``)."""
    argv = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", backing_format, "-b", str(backing), str(disk)]
    subprocess.run(argv, check=True, capture_output=True)


def publish_image_files(store: ObjectStore, prefix: str, image: SnapshotImage, pins: PinSet) -> None:
    """Upload a captured image's ``vmstate`` and ``disk.qcow2`` under ``prefix``, pinning both."""
    pins.put_file(store, f"{prefix}/vmstate", image.vmstate)
    pins.put_file(store, f"{prefix}/disk.qcow2", image.disk)


def fetch_image_files(store: ObjectStore, prefix: str, work: Path, pins: PinSet) -> None:
    """``prefix``'s ``vmstate`` and ``disk.qcow2`` into ``work``, each only once it matches its pin."""
    for name in ("vmstate", "disk.qcow2"):
        pins.fetch_file(store, f"{prefix}/{name}", work / name)


def upload_captured(
    store: ObjectStore, prefix: str, image: SnapshotImage, template: Template, timing: LeaseTiming
) -> tuple[ChunkIndex, PinSet]:
    """Upload a captured image under ``prefix``, all but its manifest: the memory's chunks the store lacks, its
    index, vmstate and disk overlay, under a lease that names ``prefix`` and the template generation it sits on
    (kept by ``cryobox gc --store`` meanwhile). Returns the index and the pins."""
    index = scan_image(image.memory, image.id)
    lease = PublishLease.begin(
        store, [prefix, template_prefix(template.name, template.generation)], index.digests(), timing
    )
    pins = PinSet()
    upload_image(store, f"{prefix}/memory", image.memory, image.id, pins, lease=lease, index=index)
    publish_image_files(store, prefix, image, pins)
    return index, pins


def memory_summary(index: ChunkIndex) -> dict[str, int]:
    """What a manifest records of a memory image's chunks."""
    return {
        "image_size": index.image_size,
        "stored_bytes": index.stored_bytes,
        "distinct_chunks": len(index.digests()),
    }


def publish_image(
    store: ObjectStore,
    stored: StoredImage,
    image: SnapshotImage,
    template: Template,
    timing: LeaseTiming,
    extra: Mapping[str, Any] | None = None,
) -> Published:
    """Upload ``image`` (captured over ``template``'s disk) under ``stored.prefix``; the manifest goes last (with
    ``extra``'s fields added), and the sha256 of its bytes is returned (the registry pins it). Idempotent:
    nothing is uploaded while the store holds the manifest this host uploaded for the image; otherwise (none, or
    another one) it is uploaded again.
    Chunks the store has (its template's, its siblings') are not uploaded again.

    :raises StateError: the image is not over the current generation of ``template``.
    """
    if Path(backing_file(image.disk)) != template.disk:
        raise StateError(
            f"{stored.subject} is not over the current generation of template {template.name} "
            f"({template.generation}); {stored.unpublishable}",
            details={"id": stored.ident, "template": template.name},
        )
    done = still_published(store, stored.manifest_key, image.path)
    if done is not None:
        return Published(stored.prefix, done)
    if stored.one_image:
        found = stored_manifest(store, stored.prefix)
        if found is not None and found.get("id") != image.id:
            delete_published(store, stored.prefix)  # an earlier image under the prefix
    index, pins = upload_captured(store, stored.prefix, image, template, timing)
    manifest = {**image.manifest, **(extra or {})}
    if stored.one_image:
        manifest["id"] = image.id  # what a later publish compares
    manifest.update(
        layout=LAYOUT_VERSION,
        template_generation=template.generation,
        template_prefix=template_prefix(template.name, template.generation),
        memory_chunks=memory_summary(index),
        published_at=time.time(),
    )
    manifest[PINS_FIELD] = pins.to_json()
    return Published(stored.prefix, put_manifest(store, stored.manifest_key, manifest, image.path))


def import_image(
    store: ObjectStore, stored: StoredImage, final: Path, template: Template, manifest_sha256: str | None
) -> None:
    """Make the image under ``stored.prefix`` restorable here as ``final`` (vmstate, the overlay rebased onto this
    host's copy of ``template``'s disk, the memory when ``stored.memory_home``, the local manifest last). The
    manifest must hash to ``manifest_sha256`` (the registry's pin; ``None``: a row from before manifests were
    pinned, accepted with a warning) before it is parsed (:func:`~cryobox.objstore.manifests.fetch_manifest`).

    :raises ObjectNotFound: nothing is stored under the prefix.
    :raises IntegrityError: the manifest is not the pinned one (or an object not the one it pins).
    :raises StateError: it sits on another template or generation than ``template``, or ``final`` exists.
    """
    prefix = stored.prefix
    what = f"the manifest of {stored.subject}"
    manifest, fetched = fetch_manifest(store, stored.manifest_key, manifest_sha256, what)
    if (manifest.get("template"), manifest.get("template_generation")) != (template.name, template.generation):
        raise StateError(
            f"{stored.subject} is of template {manifest.get('template')} "
            f"({manifest.get('template_generation')}); this host serves {template.name} ({template.generation})",
            details={"id": stored.ident},
        )
    pins = PinSet.from_manifest(manifest, what)
    if (final / "manifest.json").exists():
        raise StateError(f"{stored.subject} is already on this host", details={"id": stored.ident})
    machine = dict(manifest["machine"], **template.machine.host_files())
    backing = (template.disk, "qcow2")
    if stored.memory_home:
        manifest.update(id=final.name, machine=machine, imported_from=store.url, imported_at=time.time())
        materialize(store, prefix, final, backing, manifest, pins, memory=True)
        return
    # its memory will be paged from the store: an index in an earlier format is refused now, not at the restore
    ChunkIndex.from_bytes(pins.fetch_bytes(store, f"{prefix}/memory.idx"))
    manifest.update(machine=machine, memory_prefix=prefix, imported_from=store.url, imported_at=time.time())
    materialize(store, prefix, final, backing, manifest, pins, fetched)  # records the manifest it came from


def materialize(
    store: ObjectStore,
    prefix: str,
    final: Path,
    backing: tuple[Path, str],
    manifest: dict[str, Any],
    pins: PinSet,
    fetched_sha256: str | None = None,
    *,
    memory: bool = False,
) -> None:
    """Download ``prefix``'s vmstate and disk overlay (and with ``memory`` its memory image; each checked against
    its pin) into a work directory beside ``final``, point the overlay at this host's ``backing`` (path, format),
    write ``manifest`` last and rename the directory into place. ``fetched_sha256``: the hash of the manifest
    fetched, recorded beside it."""
    work = final.with_name(f".{final.name}.fetch{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        fetch_image_files(store, prefix, work, pins)
        rebase(work / "disk.qcow2", *backing)
        if memory:
            download_image(store, f"{prefix}/memory", work / "memory", pins)
        if fetched_sha256 is not None:
            record_manifest(work, f"{prefix}/manifest.json", fetched_sha256)
        write_json_atomic(work / "manifest.json", manifest)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(final)
        os.replace(work, final)
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
