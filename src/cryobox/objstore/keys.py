"""Every key cryobox writes in the object store, in one place.

::

    templates/<name>/<generation>/...   a baked template generation (memory.idx, memory.trace, vmstate,
                                        disk.qcow2, manifest.json written last)
    templates/<name>/latest             {"generation": ...} of the newest publish
    snapshots/<id>/...                  a snapshot (the same files, plus evidence/<name>)
    hibernations/<sandbox id>/...       a hibernated sandbox's image, so it can wake on another host
    volumes/<volume id>/...             a volume's last stored image (image.idx, manifest.json written last), so it
                                        can move to another host (:mod:`cryobox.agent.volumes.transfer`)
    images/<kind>/<cache key>/<file>    kernel, initrd, rootfs base of the content-addressed image cache
    chunks/<sha256[:2]>/<sha256>        every distinct non-zero 4 MiB chunk of every image, stored once
    build-contexts/<sha256>             a template recipe's COPY sources (gzip'd tar, named by its SHA-256)
    build-steps/<key>/<sha256>.qcow2    a recipe build step's cached qcow2 layer, named by the sha256 of its bytes
    build-steps/<key>/meta.json         that step's meta, written last (layer, version, parent or base, last used:
                                        :mod:`.buildsteps`); ``<key>`` is the step's cache key (64 hex digits)
    leases/..., gc/...                  publishes and store GCs announcing themselves (:mod:`.leases`)

An image (a template generation, a snapshot, a hibernation) is whole exactly while its ``manifest.json`` exists:
it is written last and deleted first.
"""

from __future__ import annotations

import re

from ..errors import InvalidArgument

LAYOUT_VERSION = 2
"""Store layout of what a publish writes: 2 = content-addressed chunk objects (1: one memory.pack per image)."""

TEMPLATES = "templates"
SNAPSHOTS = "snapshots"
HIBERNATIONS = "hibernations"
VOLUMES = "volumes"
VOLUME_INDEX = "image.idx"
IMAGES = "images"
CHUNKS = "chunks"
MANIFEST = "manifest.json"
LATEST = "latest"
EVIDENCE = "evidence"
BUILD_CONTEXTS = "build-contexts"
BUILD_STEPS = "build-steps"
STEP_META = "meta.json"

IMAGE_ROOTS = {TEMPLATES: 3, SNAPSHOTS: 2, HIBERNATIONS: 2, VOLUMES: 2}
"""Top-level prefix -> how many key segments name one image (``templates/<name>/<generation>``, ``snapshots/<id>``)."""

EVIDENCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def template_prefix(name: str, generation: str) -> str:
    return f"{TEMPLATES}/{name}/{generation}"


def template_latest(name: str) -> str:
    """The key naming a template's newest published generation."""
    return f"{TEMPLATES}/{name}/{LATEST}"


def build_context(sha256: str) -> str:
    """A recipe's context blob (E2B's ``filesHash``): ``InvalidArgument`` unless ``sha256`` is 64 hex digits."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise InvalidArgument(f"not a SHA-256 hex digest: {sha256[:80]!r}", details={"hash": sha256[:80]})
    return f"{BUILD_CONTEXTS}/{sha256}"


def _hex64(value: str, what: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise InvalidArgument(f"not a {what} (64 hex digits): {value[:80]!r}", details={"value": value[:80]})
    return value


def build_step_prefix(key: str) -> str:
    """Where a recipe build step's cached layer lives (``key``: the step's cache key, 64 hex digits)."""
    return f"{BUILD_STEPS}/{_hex64(key, 'build step key')}"


def build_step_meta(key: str) -> str:
    return f"{build_step_prefix(key)}/{STEP_META}"


def build_step_layer(key: str, sha256: str) -> str:
    return f"{build_step_prefix(key)}/{_hex64(sha256, 'SHA-256 hex digest')}.qcow2"


def snapshot_prefix(snapshot_id: str) -> str:
    return f"{SNAPSHOTS}/{snapshot_id}"


def hibernation_prefix(sandbox_id: str) -> str:
    return f"{HIBERNATIONS}/{sandbox_id}"


def volume_prefix(volume_id: str) -> str:
    return f"{VOLUMES}/{volume_id}"


def manifest_key(prefix: str) -> str:
    return f"{prefix}/{MANIFEST}"


def check_evidence_name(name: str) -> str:
    """``name`` if it may name an evidence file (it becomes a file name on a host and a store key segment)."""
    if not EVIDENCE_NAME.fullmatch(name):
        raise InvalidArgument(
            "evidence names are 1-128 characters of letters, digits, '.', '_' and '-' (no leading dot)",
            details={"name": name},
        )
    return name


def evidence_prefix(snapshot_id: str) -> str:
    return f"{snapshot_prefix(snapshot_id)}/{EVIDENCE}/"


def evidence_key(snapshot_id: str, name: str) -> str:
    return evidence_prefix(snapshot_id) + check_evidence_name(name)
