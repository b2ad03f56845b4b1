"""Templates in the object store: publish a baked template, and fetch one onto a host that lacks it.

Store layout (every name carries the generation, so a re-bake is a new name and never overwrites)::

    templates/<name>/<generation>/memory.idx     chunk index: size, 4 MiB chunks, zero bitmap, sha256 per chunk
    templates/<name>/<generation>/memory.pack    the non-zero chunks (range GETs fetch one chunk each)
    templates/<name>/<generation>/memory.trace   chunks in the order a restore first read them (prefetch)
    templates/<name>/<generation>/vmstate        device state
    templates/<name>/<generation>/disk.qcow2     root-disk overlay (its backing file is rebased on fetch)
    templates/<name>/<generation>/manifest.json  written last: the template is published once it exists; it pins
                                                 the size and sha256 of every object above (``pins.py``)
    templates/<name>/latest                      {"generation": ...} of the newest publish
    images/<kind>/<cache key>/<file>[.idx|.pack] kernel, initrd, rootfs base (sparse images chunked like memory)

Snapshots (``publish_snapshot``, on request)::

    snapshots/<id>/memory.{idx,pack}, vmstate, disk.qcow2   (the overlay over its template's disk)
    snapshots/<id>/manifest.json                             written last; names the template generation; the
                                                             registry row pins its sha256 (``manifests.py``)

Every object a fetch downloads (vmstate, disk overlay, kernel, initrd, the chunk indexes) must match the pin
its manifest records before it is renamed into place or parsed; a manifest without pins is refused.

A fetched template gets the usual directory (``vmstate``, ``disk.qcow2``, ``manifest.json``) but no ``memory``:
its restores map the memory server's file for ``templates/<name>/<generation>`` and fault chunks in on demand.
That file's name carries the sha256 the local manifest pins for ``memory.idx`` (fetched manifests keep their
pins; a template baked here records the ones :func:`publish_template` returns), and the memory server checks the
index against it before parsing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from ...errors import CryoboxError, IntegrityError, ObjectNotFound, StateError
from ...util.files import fsync_dir, write_json_atomic
from ...util.proc import Progress
from ..templates import Template
from ..vm import MachineConfig
from .chunkfmt import ChunkIndex, pack_image, unpack_image
from .manifests import Published, fetch_manifest, put_manifest, record_manifest, still_published
from .objstore import ObjectStore
from .pins import PINS_FIELD, Pin, PinSet, pinned_sha256
from .snapshots import SnapshotImage

LAYOUT_VERSION = 1


def template_prefix(name: str, generation: str) -> str:
    return f"templates/{name}/{generation}"


def upload_image(
    store: ObjectStore, base: str, path: Path, generation: str, work_dir: Path, pins: PinSet
) -> ChunkIndex:
    """Upload a sparse raw image as ``<base>.pack`` (non-zero chunks) and then ``<base>.idx`` (pinned: it holds
    the sha256 of every chunk of the pack)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    pack = work_dir / f".pack-{secrets.token_hex(6)}"
    try:
        index = pack_image(path, pack, generation)
        store.put_file(f"{base}.pack", pack)
    finally:
        pack.unlink(missing_ok=True)
    pins.put(store, f"{base}.idx", index.to_bytes())
    return index


def pin_stored_image(store: ObjectStore, base: str, path: Path, generation: str, pins: PinSet) -> None:
    """Pin the index of an image already in the store (uploaded by an earlier publish) once it is found to
    describe the local ``path`` exactly (the local image is hashed; no pack is written).

    :raises IntegrityError: the stored index is not the one ``path`` would get.
    """
    key = f"{base}.idx"
    stored = store.get(key)
    if stored != pack_image(path, Path(os.devnull), generation).to_bytes():
        raise IntegrityError(
            f"the stored chunk index {key!r} does not describe the local image {path}: refusing to pin it",
            details={"key": key, "path": str(path)},
        )
    pins.add(key, Pin.of_bytes(stored))


def download_image(store: ObjectStore, base: str, dest: Path, pins: PinSet) -> ChunkIndex:
    """Rebuild the sparse image stored as ``<base>.{idx,pack}`` at ``dest``: the index must match its pin before
    it is parsed, and every chunk of the pack its sha256 in the index. Atomic: nothing is left on failure."""
    index = ChunkIndex.from_bytes(pins.fetch_bytes(store, f"{base}.idx"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}")
    pack = tmp.with_name(f"{tmp.name}.pack")
    try:
        store.download(f"{base}.pack", pack)
        unpack_image(index, pack, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        tmp.unlink(missing_ok=True)
        pack.unlink(missing_ok=True)
    return index


def _image_key(images_dir: Path, path: Path) -> str:
    """``images/<kind>/<cache key>/<file>`` for a file of the content-addressed image cache."""
    try:
        rel = path.resolve().relative_to(images_dir.resolve())
    except ValueError:
        raise CryoboxError(f"{path} is not in the image cache {images_dir}") from None
    return f"images/{rel.as_posix()}"


def local_pins(template: Template) -> PinSet:
    """The pins a local bake keeps in its manifest (recorded after publishing it), else the pin of its memory
    index computed from its local memory (a bake recorded before pins were kept, published earlier): what this
    host's vmstate belongs with, so a stored index that differs is refused when paged, not trusted."""
    key = f"{template_prefix(template.name, template.generation)}/memory.idx"
    if pinned_sha256(template.manifest, key) is not None:
        return PinSet.from_manifest(template.manifest, f"the local manifest of template {template.name}")
    pins = PinSet()
    pins.add(key, Pin.of_bytes(pack_image(template.memory, Path(os.devnull), template.generation).to_bytes()))
    return pins


def publish_template(
    store: ObjectStore, template: Template, images_dir: Path, work_dir: Path, progress: Progress
) -> PinSet:
    """Upload ``template`` (skipping objects already there); the manifest goes last. Returns the pins its
    manifest records (:func:`local_pins` when it is published already), for the local manifest to keep
    (``templates.record_pins``): lazy restores of the template name its memory index by its pin."""
    prefix = template_prefix(template.name, template.generation)
    if store.exists(f"{prefix}/manifest.json"):
        return local_pins(template)
    started = time.monotonic()
    progress(f"publishing template {template.name} ({template.generation}) to {store.url}")
    pins = PinSet()
    index = upload_image(store, f"{prefix}/memory", template.memory, template.generation, work_dir, pins)
    pins.put_file(store, f"{prefix}/vmstate", template.vmstate)
    pins.put_file(store, f"{prefix}/disk.qcow2", template.disk)
    files: dict[str, str] = {}
    for role, path in (
        ("kernel", template.machine.kernel),
        ("initrd", template.machine.initrd),
        ("rootfs", Path(template.manifest["rootfs"])),
    ):
        key = _image_key(images_dir, path)
        files[role] = key
        if role == "rootfs":
            if store.exists(f"{key}.idx"):
                pin_stored_image(store, key, path, key, pins)
            else:
                upload_image(store, key, path, key, work_dir, pins)
        elif store.exists(key):
            pins.add(key, Pin.of_file(path))  # content-addressed: a fetch refuses a stored copy that differs
        else:
            pins.put_file(store, key, path)
    manifest = dict(template.manifest)
    manifest.update(
        layout=LAYOUT_VERSION,
        machine_config=template.machine.to_json(),
        files=files,
        memory={"image_size": index.image_size, "stored_bytes": index.stored_bytes, "chunks": index.chunk_count},
        published_at=time.time(),
    )
    manifest[PINS_FIELD] = pins.to_json()
    store.put(f"{prefix}/manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
    store.put(f"templates/{template.name}/latest", json.dumps({"generation": template.generation}).encode())
    progress(f"  published in {time.monotonic() - started:.1f}s ({index.stored_bytes >> 20} MiB of memory chunks)")
    return pins


def latest_generation(store: ObjectStore, name: str) -> str:
    try:
        return str(json.loads(store.get(f"templates/{name}/latest"))["generation"])
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
    if (final / "manifest.json").exists():
        found: dict[str, Any] = json.loads((final / "manifest.json").read_text())
        if "machine_config" in found:  # fetched before
            return _load(final)
        # baked here (a cache dir shared with a building host): the same generation, files all local
        published: dict[str, Any] = json.loads(store.get(f"{prefix}/manifest.json"))
        machine = dict(published["machine_config"], kernel=found["kernel"], initrd=found["initrd"])
        if PINS_FIELD not in found and PINS_FIELD in published:
            # not (yet) recorded by the building host: lazy restores name the memory index by its pin, taken from
            # the published manifest that gives the machine config too
            found = {**found, PINS_FIELD: published[PINS_FIELD]}
        return Template(name, generation, final, MachineConfig.from_json(machine), found)
    manifest: dict[str, Any] = json.loads(store.get(f"{prefix}/manifest.json"))
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
    machine = dict(manifest["machine_config"], kernel=str(local["kernel"]), initrd=str(local["initrd"]))
    manifest.update(
        machine_config=machine,
        kernel=str(local["kernel"]),
        initrd=str(local["initrd"]),
        rootfs=str(local["rootfs"]),
        memory_prefix=prefix,
        fetched_from=store.url,
    )
    _materialize(store, prefix, final, (local["rootfs"], "raw"), manifest, pins)
    return _load(final)


def _materialize(
    store: ObjectStore,
    prefix: str,
    final: Path,
    backing: tuple[Path, str],
    manifest: dict[str, Any],
    pins: PinSet,
    fetched_sha256: str | None = None,
) -> None:
    """Download ``prefix``'s vmstate and disk overlay (each checked against its pin) into a work directory beside
    ``final``, point the overlay at this host's ``backing`` (path, format), write ``manifest`` last and rename
    the directory into place. ``fetched_sha256``: the hash of the manifest fetched, recorded beside it."""
    work = final.with_name(f".{final.name}.fetch{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        fetch_image_files(store, prefix, work, pins)
        _rebase(work / "disk.qcow2", *backing)
        if fetched_sha256 is not None:
            record_manifest(work, f"{prefix}/manifest.json", fetched_sha256)
        write_json_atomic(work / "manifest.json", manifest)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(final)
        os.replace(work, final)
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch_image_files(store: ObjectStore, prefix: str, work: Path, pins: PinSet) -> None:
    """``prefix``'s ``vmstate`` and ``disk.qcow2`` into ``work``, each only once it matches its pin."""
    for name in ("vmstate", "disk.qcow2"):
        pins.fetch_file(store, f"{prefix}/{name}", work / name)


def _rebase(disk: Path, backing: Path, backing_format: str) -> None:
    """Point a downloaded overlay at this host's copy of its backing file (metadata only: ``-u``)."""
    argv = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", backing_format, "-b", str(backing), str(disk)]
    subprocess.run(argv, check=True, capture_output=True)


def _load(path: Path) -> Template:
    manifest: dict[str, Any] = json.loads((path / "manifest.json").read_text())
    machine = MachineConfig.from_json(manifest["machine_config"])
    return Template(str(manifest["name"]), str(manifest["generation"]), path, machine, manifest)


def snapshot_prefix(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}"


def _backing_file(disk: Path) -> str:
    out = subprocess.run(
        ["qemu-img", "info", "--output=json", "-U", str(disk)], check=True, capture_output=True, text=True
    )
    return str(json.loads(out.stdout).get("backing-filename") or "")


def publish_image_files(store: ObjectStore, prefix: str, image: SnapshotImage, pins: PinSet) -> None:
    """Upload a snapshot's ``vmstate`` and ``disk.qcow2`` under ``prefix``, pinning both."""
    pins.put_file(store, f"{prefix}/vmstate", image.vmstate)
    pins.put_file(store, f"{prefix}/disk.qcow2", image.disk)


def publish_snapshot(store: ObjectStore, image: SnapshotImage, template: Template, work_dir: Path) -> Published:
    """Upload a snapshot of ``template`` (memory chunked, vmstate, disk overlay); the manifest goes last, and the
    sha256 of its bytes is returned (the registry pins it). Idempotent: nothing is uploaded while the store holds
    the manifest this host uploaded; otherwise (none, or another one) the snapshot is uploaded again."""
    if Path(_backing_file(image.disk)) != template.disk:
        raise StateError(
            f"snapshot {image.id} is not over the current generation of template {template.name} "
            f"({template.generation}); only those can be published",
            details={"id": image.id, "template": template.name},
        )
    prefix = snapshot_prefix(image.id)
    done = still_published(store, f"{prefix}/manifest.json", image.path)
    if done is not None:
        return Published(prefix, done)
    pins = PinSet()
    index = upload_image(store, f"{prefix}/memory", image.memory, image.id, work_dir, pins)
    publish_image_files(store, prefix, image, pins)
    manifest = dict(image.manifest)
    manifest.update(
        template_generation=template.generation,
        template_prefix=template_prefix(template.name, template.generation),
        memory_chunks={"image_size": index.image_size, "stored_bytes": index.stored_bytes},
        published_at=time.time(),
    )
    manifest[PINS_FIELD] = pins.to_json()
    return Published(prefix, put_manifest(store, f"{prefix}/manifest.json", manifest, image.path))


def import_snapshot(
    store: ObjectStore, snapshot_id: str, snapshots_dir: Path, template: Template, manifest_sha256: str | None = None
) -> Path:
    """Make a published snapshot restorable here: its vmstate and disk overlay (rebased onto this host's copy
    of the template's disk) in ``snapshots_dir/<id>/``; the memory stays in the store, paged in on demand.
    The manifest must hash to ``manifest_sha256`` (the registry's pin; ``None``: a row from before manifests were
    pinned, accepted with a warning) before it is parsed (:func:`.manifests.fetch_manifest`)."""
    prefix = snapshot_prefix(snapshot_id)
    manifest, fetched = fetch_manifest(
        store, f"{prefix}/manifest.json", manifest_sha256, f"the manifest of snapshot {snapshot_id}"
    )
    if (manifest.get("template"), manifest.get("template_generation")) != (template.name, template.generation):
        raise StateError(
            f"snapshot {snapshot_id} is of template {manifest.get('template')} "
            f"({manifest.get('template_generation')}); this host serves {template.name} ({template.generation})",
            details={"id": snapshot_id},
        )
    pins = PinSet.from_manifest(manifest, f"the manifest of snapshot {snapshot_id}")
    final = snapshots_dir / snapshot_id
    if (final / "manifest.json").exists():
        raise StateError(f"snapshot {snapshot_id} is already on this host", details={"id": snapshot_id})
    machine = dict(manifest["machine"], kernel=str(template.machine.kernel), initrd=str(template.machine.initrd))
    manifest.update(machine=machine, memory_prefix=prefix, imported_from=store.url, imported_at=time.time())
    _materialize(store, prefix, final, (template.disk, "qcow2"), manifest, pins, fetched)
    return final
