"""A volume's image ↔ the object store, so a volume can move between hosts.

``store`` uploads a detached image as ``volumes/<id>/image.idx`` (the chunked format of :mod:`~cryobox.objstore.
chunkfmt`: every distinct non-zero 4 MiB chunk is ``chunks/<sha[:2]>/<sha>``, shared with every other image) and
then ``volumes/<id>/manifest.json``, which pins the index; the sha256 of the manifest's bytes is returned for the
registry to pin. Only chunks the store lacks are uploaded (one HEAD per distinct chunk, :func:`~cryobox.objstore.
images.upload_chunks`): a second store after 10 % of the image changed uploads about 10 %. The upload holds a
:class:`~cryobox.objstore.leases.PublishLease` naming the prefix and the chunks, so a concurrent ``cryobox gc
--store`` keeps what it relies on. Each chunk is read again and checked against the index before it goes up: an
image that changes while stored fails the store (it must be detached; the agent checks no VM of its has it).

The prefix holds one image, the last stored: a later store replaces the index, then the manifest. Between the two a
fetch with the previous pin finds the old manifest pinning another index and is refused (``IntegrityError``), never
given a mix.

``fetch`` checks the manifest against the registry's pin before parsing it, the index against the manifest's pin,
every chunk against the index, rebuilds the image under a temporary name beside the final one, allocates it in
full (a guest filling it gets ENOSPC from its own file system, as for a new volume), fsyncs it and renames it into
place: a crash leaves no half image under a volume's name (a temporary file the next fetch or a sweep removes).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...agentapi.models_volumes import StoredVolume
from ...errors import IntegrityError
from ...objstore.chunkfmt import scan_image
from ...objstore.client import ObjectStore
from ...objstore.images import download_image, pin_index, upload_chunks
from ...objstore.keys import LAYOUT_VERSION, VOLUME_INDEX, manifest_key, volume_prefix
from ...objstore.leases import DEFAULT_TIMING, LeaseTiming, PublishLease
from ...objstore.manifests import fetch_manifest, manifest_bytes
from ...objstore.pins import PINS_FIELD, PinSet
from ...util.files import fsync_dir

KIND = "volume"
INDEX_BASE = VOLUME_INDEX.removesuffix(".idx")
TMP_PREFIX = ".fetch-"
"""Temporary images of a fetch in progress (hidden names: never matched by :meth:`.store.VolumeStore.ids`)."""


def store_volume(store: ObjectStore, volume_id: str, image: Path, timing: LeaseTiming = DEFAULT_TIMING) -> StoredVolume:
    """Upload the detached image ``image`` of ``volume_id`` (the chunks the store lacks, the index, the manifest
    last); returns what was stored and the sha256 of the manifest's bytes."""
    started = time.monotonic()
    prefix = volume_prefix(volume_id)
    index = scan_image(image, volume_id)
    lease = PublishLease.begin(store, [prefix], index.digests(), timing)
    uploaded = upload_chunks(store, image, index, lease)
    pins = PinSet()
    index_bytes = index.to_bytes()
    pin_index(pins, f"{prefix}/{INDEX_BASE}", index)  # pins <prefix>/image.idx
    store.put(f"{prefix}/{VOLUME_INDEX}", index_bytes)
    manifest: dict[str, Any] = {
        "kind": KIND,
        "layout": LAYOUT_VERSION,
        "volume_id": volume_id,
        "size_bytes": index.image_size,
        "stored_bytes": index.stored_bytes,
        "distinct_chunks": len(index.digests()),
        "stored_at": time.time(),
        "nonce": secrets.token_hex(8),  # every store's manifest differs: a pin names one store, never an older one
        PINS_FIELD: pins.to_json(),
    }
    data = manifest_bytes(manifest)
    store.put(manifest_key(prefix), data)
    return StoredVolume(
        volume_id=volume_id,
        key=prefix,
        manifest_sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=index.image_size,
        stored_bytes=index.stored_bytes,
        uploaded_bytes=uploaded.put_bytes,
        chunks_put=uploaded.put,
        chunks_reused=uploaded.reused,
        seconds=time.monotonic() - started,
    )


def fetch_volume(
    store: ObjectStore,
    volume_id: str,
    manifest_sha256: str,
    final: Path,
    room_for: Callable[[int], None] | None = None,
) -> int:
    """Rebuild ``volume_id``'s stored image as ``final`` (replacing what is there), atomically; returns its size.
    ``room_for`` raises when this host has no room for the image's size (checked before any download).

    :raises ObjectNotFound: nothing is stored for the volume.
    :raises IntegrityError: the manifest is not the pinned one, not a volume's manifest of ``volume_id``, or an
        object it names is not the one it pins; nothing was installed.
    """
    prefix = volume_prefix(volume_id)
    what = f"the manifest of volume {volume_id}"
    manifest, _ = fetch_manifest(store, manifest_key(prefix), manifest_sha256, what)
    if manifest.get("kind") != KIND or manifest.get("volume_id") != volume_id:
        raise IntegrityError(f"{what} is not a stored image of that volume", details={"volume_id": volume_id})
    pins = PinSet.from_manifest(manifest, what)
    size = manifest.get("size_bytes")
    if room_for is not None and isinstance(size, int):
        room_for(size)  # 503 before anything is downloaded
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}.{secrets.token_hex(6)}")
    try:
        index = download_image(store, f"{prefix}/{INDEX_BASE}", tmp, pins)
        with open(tmp, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, index.image_size)  # allocated in full, like a new volume
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return index.image_size
