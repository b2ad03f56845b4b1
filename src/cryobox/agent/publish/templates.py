"""Templates in the object store: publish a baked template, and fetch one onto a host that lacks it.

Store layout (every name carries the generation, so a re-bake is a new name and never overwrites)::

    templates/<name>/<generation>/memory.idx     chunk index: size, 4 MiB chunks, zero bitmap, sha256 per chunk
    templates/<name>/<generation>/memory.trace   chunks in the order a restore first read them (prefetch)
    templates/<name>/<generation>/vmstate        device state
    templates/<name>/<generation>/disk.qcow2     root-disk overlay (its backing file is rebased on fetch)
    templates/<name>/<generation>/manifest.json  written last: the template is published once it exists; it pins
                                                 the size and sha256 of every object above (``pins.py``)
    templates/<name>/latest                      {"generation": ...} of the newest publish
    images/<kind>/<cache key>/<file>[.idx]       kernel, initrd, rootfs base (sparse images chunked like memory)
    chunks/<sha256[:2]>/<sha256>                 every distinct non-zero chunk of every image, stored once
                                                 (``objstore/chunkfmt.py``, ``objstore/images.py``), before the
                                                 indexes naming it

Snapshots (``publish_snapshot``, on request)::

    snapshots/<id>/memory.idx, vmstate, disk.qcow2   (the overlay over its template's disk; the memory's chunks
                                                     are shared with the template's and its siblings' when equal)
    snapshots/<id>/manifest.json                     written last; names the template generation; the registry
                                                     row pins its sha256 (``manifests.py``)

A snapshot goes up and comes back through the path a hibernation takes too (:mod:`.images`, under its prefix).

Every publish holds a lease naming its prefixes and chunks (``leases.py``) so that ``cryobox gc --store``
(``objstore/gc.py``) keeps what it relies on. ``LAYOUT_VERSION`` 2 is this layout; a template published in layout 1
(one ``memory.pack`` per image) is published again by the next :func:`publish_template` of its generation, and a
fetch of one is refused with a :class:`StoreError` saying so.

Every object a fetch downloads (vmstate, disk overlay, kernel, initrd, the chunk indexes) must match the pin
its manifest records before it is renamed into place or parsed; a manifest without pins is refused.

A fetched template gets the usual directory (``vmstate``, ``disk.qcow2``, ``manifest.json``) but no ``memory``:
its restores map the memory server's file for ``templates/<name>/<generation>`` and fault chunks in on demand.
That file's name carries the sha256 the local manifest pins for ``memory.idx`` (fetched manifests keep their
pins; a template baked here records the ones :func:`publish_template` returns), and the memory server checks the
index against it before parsing it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ...errors import CryoboxError, ObjectNotFound, StoreError
from ...objstore.chunkfmt import scan_image
from ...objstore.client import ObjectStore
from ...objstore.images import download_image as download_image  # chunked images: .imagestore (importable here too)
from ...objstore.images import pin_index, stored_index_matches
from ...objstore.images import upload_image as upload_image
from ...objstore.keys import LAYOUT_VERSION, snapshot_prefix, template_latest, template_prefix
from ...objstore.leases import DEFAULT_TIMING, LeaseTiming, PublishLease
from ...objstore.manifests import Published
from ...objstore.pins import PINS_FIELD, Pin, PinSet, pinned_sha256
from ...util.proc import Progress
from ...util.progress import as_reporter
from ..snapshot.store import SnapshotImage
from ..templates.bake import Template
from ..vm import MachineConfig
from .images import StoredImage, import_image, materialize, publish_image


def _image_key(images_dir: Path, path: Path) -> str:
    """``images/<kind>/<cache key>/<file>`` for a file of the content-addressed image cache."""
    try:
        rel = path.resolve().relative_to(images_dir.resolve())
    except ValueError:
        raise CryoboxError(f"{path} is not in the image cache {images_dir}") from None
    return f"images/{rel.as_posix()}"


def local_pins(template: Template, published_sha256: str | None = None) -> PinSet:
    """The pins a local bake keeps in its manifest (recorded after publishing it), if they pin the memory index the
    store has (``published_sha256``, when known); else the pin of the index computed from its local memory (a bake
    recorded before pins were kept, or published again since): what this host's vmstate belongs with, so a stored
    index that differs is refused when paged, not trusted."""
    key = f"{template_prefix(template.name, template.generation)}/memory.idx"
    recorded = pinned_sha256(template.manifest, key)
    if recorded is not None and published_sha256 in (None, recorded):
        return PinSet.from_manifest(template.manifest, f"the local manifest of template {template.name}")
    pins = PinSet()
    pins.add(key, Pin.of_bytes(scan_image(template.memory, template.generation).to_bytes()))
    return pins


def _small_files(machine: MachineConfig) -> list[tuple[str, Path]]:
    """The image files a template's machine boots from, besides its root filesystem, by role."""
    files = [("kernel", machine.kernel), ("initrd", machine.initrd)]
    if machine.agent_disk is not None:
        files.append(("agentdisk", machine.agent_disk))
    return files


def _host_files(local: dict[str, Any]) -> dict[str, str]:
    """The machine config's host paths from a manifest's (or fetch's) ``kernel``/``initrd``/``agentdisk``."""
    files = {"kernel": str(local["kernel"]), "initrd": str(local["initrd"])}
    if local.get("agentdisk"):
        files["agent_disk"] = str(local["agentdisk"])
    return files


def _stored_manifest(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(store.get(key))
    except ObjectNotFound:
        return None
    return found


def publish_template(
    store: ObjectStore,
    template: Template,
    images_dir: Path,
    progress: Progress,
    *,
    timing: LeaseTiming = DEFAULT_TIMING,
) -> PinSet:
    """Upload ``template`` (skipping chunks and base images already there); the manifest goes last. Returns the
    pins its manifest records (:func:`local_pins` when it is published already), for the local manifest to keep
    (``templates.record_pins``): lazy restores of the template name its memory index by its pin. A generation
    published in an earlier layout is published again, over it. Chunks go up straight from the image files."""
    prefix = template_prefix(template.name, template.generation)
    stored = _stored_manifest(store, f"{prefix}/manifest.json")
    if stored is not None and stored.get("layout") == LAYOUT_VERSION:
        return local_pins(template, pinned_sha256(stored, f"{prefix}/memory.idx"))
    started = time.monotonic()
    again = f" again (layout {stored.get('layout')} -> {LAYOUT_VERSION})" if stored is not None else ""
    progress(f"publishing template {template.name} ({template.generation}){again} to {store.url}")
    phase = as_reporter(progress).phase(f"publish {template.name}", total=4)  # memory, files, rootfs, manifest
    memory = scan_image(template.memory, template.generation)
    rootfs_path = Path(template.manifest["rootfs"])
    rootfs_key = _image_key(images_dir, rootfs_path)
    rootfs = scan_image(rootfs_path, rootfs_key)
    # shared base images are never collected (a recipe's rootfs: while a manifest names it)
    rootfs_stored = stored_index_matches(store, rootfs_key, rootfs)
    chunks = [*memory.digests(), *([] if rootfs_stored else rootfs.digests())]
    # the lease names the rootfs image too: a GC must not collect a recipe's rootfs this publish found stored
    lease = PublishLease.begin(store, [prefix, rootfs_key.rsplit("/", 1)[0]], chunks, timing)
    pins = PinSet()
    upload_image(store, f"{prefix}/memory", template.memory, template.generation, pins, lease=lease, index=memory)
    phase.advance()
    pins.put_file(store, f"{prefix}/vmstate", template.vmstate)
    pins.put_file(store, f"{prefix}/disk.qcow2", template.disk)
    files: dict[str, str] = {}
    for role, path in _small_files(template.machine):
        key = _image_key(images_dir, path)
        files[role] = key
        if store.exists(key):
            pins.add(key, Pin.of_file(path))  # content-addressed: a fetch refuses a stored copy that differs
        else:
            pins.put_file(store, key, path)
    phase.advance()
    files["rootfs"] = rootfs_key
    if rootfs_stored:
        pin_index(pins, rootfs_key, rootfs)
    else:
        upload_image(store, rootfs_key, rootfs_path, rootfs_key, pins, lease=lease, index=rootfs)
    phase.advance()
    manifest = dict(template.manifest)
    manifest.update(
        layout=LAYOUT_VERSION,
        machine_config=template.machine.to_json(),
        files=files,
        memory={
            "image_size": memory.image_size,
            "stored_bytes": memory.stored_bytes,
            "chunks": memory.chunk_count,
            "distinct_chunks": len(memory.digests()),
        },
        published_at=time.time(),
    )
    manifest[PINS_FIELD] = pins.to_json()
    store.put(f"{prefix}/manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
    store.put(template_latest(template.name), json.dumps({"generation": template.generation}).encode())
    phase.advance()
    phase.finish()
    elapsed = time.monotonic() - started
    progress(f"  published in {elapsed:.1f}s ({memory.stored_bytes >> 20} MiB of memory chunks)")
    return pins


def latest_generation(store: ObjectStore, name: str) -> str:
    try:
        return str(json.loads(store.get(template_latest(name)))["generation"])
    except ObjectNotFound:
        raise ObjectNotFound(f"template {name!r} is not published in {store.url}") from None


def fetch_template(
    store: ObjectStore, name: str, templates_dir: Path, images_dir: Path, qemu: str, progress: Progress
) -> Template:
    """Make the newest published ``name`` restorable here: download its small files and base images (once per
    host; content-addressed) and leave the memory in the store, for the memory server to page in on demand."""
    generation = latest_generation(store, name)
    final = templates_dir / f"{name}-{generation}"
    prefix = template_prefix(name, generation)
    found: dict[str, Any] = {}
    if (final / "manifest.json").exists():
        found = json.loads((final / "manifest.json").read_text())
        if "machine_config" in found and found.get("layout") == LAYOUT_VERSION:  # fetched before
            return _load(final)
        # fetched in an earlier layout: fetched again below (its memory must be paged in the current one)
    if found and "machine_config" not in found:
        # baked here (a cache dir shared with a building host): the same generation, files all local
        published: dict[str, Any] = json.loads(store.get(f"{prefix}/manifest.json"))
        machine = dict(published["machine_config"], **_host_files(found))
        if PINS_FIELD not in found and PINS_FIELD in published:
            # not (yet) recorded by the building host: lazy restores name the memory index by its pin, taken from
            # the published manifest that gives the machine config too
            found = {**found, PINS_FIELD: published[PINS_FIELD]}
        return Template(name, generation, final, MachineConfig.from_json(machine), found)
    manifest: dict[str, Any] = json.loads(store.get(f"{prefix}/manifest.json"))
    if manifest.get("layout") != LAYOUT_VERSION:
        raise StoreError(
            f"template {name} ({generation}) in {store.url} is in store layout {manifest.get('layout')!r} (one "
            f"memory.pack per image); this host reads layout {LAYOUT_VERSION} only: publish it again (a host that "
            "bakes it does so when it starts)",
            details={"template": name, "generation": generation, "layout": manifest.get("layout")},
        )
    if manifest.get("qemu") != qemu:
        raise CryoboxError(
            f"template {name} ({generation}) was baked with {manifest.get('qemu')!r}; this host runs {qemu!r}"
        )
    pins = PinSet.from_manifest(manifest, f"the manifest of template {name} ({generation})")
    progress(f"fetching template {name} ({generation}) from {store.url}")
    local: dict[str, Path] = {}
    for role, key in manifest["files"].items():
        path = images_dir / key.removeprefix("images/")
        if not path.exists():
            if role == "rootfs":
                download_image(store, key, path, pins)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                pins.fetch_file(store, key, path)
        local[role] = path
    machine = dict(manifest["machine_config"], **_host_files(local))
    manifest.update(
        machine_config=machine,
        kernel=str(local["kernel"]),
        initrd=str(local["initrd"]),
        rootfs=str(local["rootfs"]),
        **({"agentdisk": str(local["agentdisk"])} if "agentdisk" in local else {}),
        memory_prefix=prefix,
        fetched_from=store.url,
    )
    materialize(store, prefix, final, (local["rootfs"], "raw"), manifest, pins)
    return _load(final)


def _load(path: Path) -> Template:
    manifest: dict[str, Any] = json.loads((path / "manifest.json").read_text())
    machine = MachineConfig.from_json(manifest["machine_config"])
    return Template(str(manifest["name"]), str(manifest["generation"]), path, machine, manifest)


def snapshot_image(snapshot_id: str) -> StoredImage:
    """A snapshot's place in the store: ``snapshots/<id>``; an import pages its memory from there."""
    return StoredImage(
        prefix=snapshot_prefix(snapshot_id),
        subject=f"snapshot {snapshot_id}",
        ident=snapshot_id,
        unpublishable="only those can be published",
    )


def publish_snapshot(
    store: ObjectStore,
    image: SnapshotImage,
    template: Template,
    *,
    timing: LeaseTiming = DEFAULT_TIMING,
) -> Published:
    """Upload a snapshot of ``template`` (memory chunked, vmstate, disk overlay); the manifest goes last, and the
    sha256 of its bytes is returned (the registry pins it). Idempotent: nothing is uploaded while the store holds
    the manifest this host uploaded; otherwise (none, or another one) the snapshot is uploaded again. Chunks the
    store has (its template's, its siblings') are not uploaded again (:func:`.images.publish_image`)."""
    return publish_image(store, snapshot_image(image.id), image, template, timing)


def import_snapshot(
    store: ObjectStore, snapshot_id: str, snapshots_dir: Path, template: Template, manifest_sha256: str | None = None
) -> Path:
    """Make a published snapshot restorable here: its vmstate and disk overlay (rebased onto this host's copy
    of the template's disk) in ``snapshots_dir/<id>/``; the memory stays in the store, paged in on demand.
    The manifest must hash to ``manifest_sha256`` (the registry's pin; ``None``: a row from before manifests were
    pinned, accepted with a warning) before it is parsed (:func:`.images.import_image`)."""
    final = snapshots_dir / snapshot_id
    import_image(store, snapshot_image(snapshot_id), final, template, manifest_sha256)
    return final
