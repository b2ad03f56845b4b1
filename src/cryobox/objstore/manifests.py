"""Manifests pinned in the registry: the sha256 of the exact manifest bytes a publish uploaded.

The pins of :mod:`.pins` protect every object a manifest names, but the manifest itself comes from the store,
which is trusted less than the host: whoever can write the store could replace a manifest together with its
pins. So the control plane's registry (the trust root) keeps the sha256 of each snapshot's and hibernation's
manifest, and every cross-host fetch checks the fetched bytes against it before parsing them:

- a publish uploads its manifest through :func:`put_manifest`, which returns the sha256 of the bytes it uploaded
  (the agent returns it in ``StoredSnapshot`` / ``StoredHibernation``; the control plane writes it into the row)
  and records it beside the published image (``stored-manifest.json``), so a repeated publish can tell whether
  the store still holds exactly those bytes (:func:`still_published`) and re-uploads otherwise;
- an import calls :func:`fetch_manifest` with the row's hash (``SnapshotRef`` / ``WakeSpec``): other bytes are an
  :class:`~cryobox.errors.IntegrityError` and nothing is installed. A row written before manifests were pinned
  has no hash: its manifest is accepted as fetched, with a warning (existing snapshots keep working).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, ObjectNotFound
from ..util.files import write_json_atomic
from .client import ObjectStore
from .keys import MANIFEST

log = logging.getLogger(__name__)

STORED_MANIFEST = "stored-manifest.json"
"""In a published image's local directory: ``{"key", "sha256"}`` of the manifest it was published with."""
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_SHA256 = re.compile(SHA256_PATTERN)


@dataclass(frozen=True)
class Published:
    """Where a publish put an image (its store prefix) and the sha256 of the manifest bytes it uploaded."""

    key: str
    manifest_sha256: str


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def put_manifest(store: ObjectStore, key: str, manifest: dict[str, Any], local_dir: Path) -> str:
    """Upload ``manifest`` as ``key`` (last: after every object it pins) and return the sha256 of the exact bytes
    uploaded, for the registry to pin; recorded in ``local_dir`` (the published image's directory) as well."""
    data = manifest_bytes(manifest)
    digest = hashlib.sha256(data).hexdigest()
    store.put(key, data)
    record_manifest(local_dir, key, digest)
    return digest


def record_manifest(local_dir: Path, key: str, sha256: str) -> None:
    write_json_atomic(local_dir / STORED_MANIFEST, {"key": key, "sha256": sha256})


def recorded_manifest(local_dir: Path, key: str) -> str | None:
    """The sha256 recorded in ``local_dir`` for the manifest ``key`` (``None``: none, or one of another key)."""
    try:
        raw = json.loads((local_dir / STORED_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    sha = raw.get("sha256") if isinstance(raw, dict) and raw.get("key") == key else None
    return sha if isinstance(sha, str) and _SHA256.fullmatch(sha) else None


def still_published(store: ObjectStore, key: str, local_dir: Path) -> str | None:
    """The sha256 ``local_dir``'s image was published with as ``key``, if the store holds exactly those bytes
    now. ``None``: publish (again): never published from here, published by a version that kept no record, or
    replaced in the store since."""
    recorded = recorded_manifest(local_dir, key)
    if recorded is None:
        return None
    try:
        data = store.get(key)
    except ObjectNotFound:
        return None
    return recorded if hashlib.sha256(data).hexdigest() == recorded else None


def fetch_manifest(store: ObjectStore, key: str, expected_sha256: str | None, what: str) -> tuple[dict[str, Any], str]:
    """Fetch the manifest ``key`` (``what`` names it in errors and the log); its bytes must hash to
    ``expected_sha256`` (the registry's pin) before they are parsed. ``None`` (a row from before manifests were
    pinned) accepts them as fetched, with a warning. Returns the manifest and the sha256 of its bytes.

    :raises IntegrityError: the bytes are not the pinned ones, or not a JSON object.
    :raises ObjectNotFound: there is no such manifest.
    """
    data = store.get(key)
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is None:
        log.warning(
            "%s has no pinned hash in the registry (stored before manifests were pinned): trusted as fetched", what
        )
    elif digest != expected_sha256:
        raise IntegrityError(
            f"{what} in the store is not the one the registry pins: its sha256 is {digest}, expected "
            f"{expected_sha256}; nothing was installed",
            details={"key": key, "sha256": digest, "expected": {"sha256": expected_sha256}},
        )
    try:
        manifest = json.loads(data)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise IntegrityError(f"{what} is not a JSON object", details={"key": key})
    return manifest, digest


def delete_published(store: ObjectStore, prefix: str) -> list[str]:
    """Remove every object of the image under ``prefix``, its manifest first (a half-deleted image never looks
    whole); idempotent. Returns the keys it found. Chunks are shared and stay: ``cryobox gc --store`` collects
    the ones no image names any more."""
    keys = store.list(prefix)
    for key in sorted(keys, key=lambda k: not k.endswith(f"/{MANIFEST}")):
        with contextlib.suppress(ObjectNotFound):
            store.delete(key)
    return keys
