"""Manifests pinned in the registry (``objstore/manifests.py``; a file:// store, qemu-img, no VM).

An attacker who controls the store can replace a manifest *together with* its pins (an edited object plus a
manifest pinning the edit): per-object pins alone accept that. The sha256 of the manifest a publish uploaded,
which the registry row keeps, does not: such an import is refused before the manifest is parsed and nothing is
installed. A row without a hash (stored before pinning) still imports, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from cryobox.agent.publish.hibernations import import_hibernation, publish_hibernation
from cryobox.agent.publish.templates import import_snapshot, publish_snapshot
from cryobox.agent.templates.bake import Template
from cryobox.errors import IntegrityError
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.manifests import STORED_MANIFEST, recorded_manifest
from cryobox.objstore.pins import Pin
from tests.support.images import machine_config, make_hibernation, make_snapshot, make_template

SNAP = "snapshots/snap-1/manifest.json"
HIB = "hibernations/sb-1/manifest.json"


def file_store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def _sha(store: ObjectStore, key: str) -> str:
    return hashlib.sha256(store.get(key)).hexdigest()


def _empty(path: Path) -> bool:
    return not path.exists() or list(path.iterdir()) == []


def _templates(tmp_path: Path) -> tuple[Template, Template]:
    machine = machine_config(tmp_path)
    return make_template(tmp_path / "a" / "templates", machine, "g1"), make_template(
        tmp_path / "b" / "templates", machine, "g1"
    )


def _replace_consistently(store: ObjectStore, prefix: str, evil: bytes) -> None:
    """What a store-side attacker can do: a new vmstate, and the manifest re-pinned to it (pins all match)."""
    store.put(f"{prefix}/vmstate", evil)
    manifest = json.loads(store.get(f"{prefix}/manifest.json"))
    manifest["pins"][f"{prefix}/vmstate"] = Pin.of_bytes(evil).to_json()
    store.put(f"{prefix}/manifest.json", json.dumps(manifest).encode())


def test_a_snapshot_publish_returns_the_hash_of_the_manifest_it_uploaded(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template_a, _ = _templates(tmp_path)
    image = make_snapshot(tmp_path / "a" / "snapshots", template_a, template_a.machine)
    published = publish_snapshot(store, image, template_a)
    assert published.manifest_sha256 == _sha(store, SNAP)
    assert recorded_manifest(image.path, SNAP) == published.manifest_sha256

    puts = store.stats.puts
    assert publish_snapshot(store, image, template_a) == published  # idempotent: nothing uploaded
    assert store.stats.puts == puts

    store.put(SNAP, b'{"replaced": true}')  # the store no longer holds what this host uploaded: published again
    again = publish_snapshot(store, image, template_a)
    assert store.stats.puts > puts and again.manifest_sha256 == _sha(store, SNAP)
    assert json.loads(store.get(SNAP))["id"] == "snap-1"


def test_a_snapshot_manifest_replaced_with_its_pins_is_refused_when_the_row_pins_the_original(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = file_store(tmp_path)
    template_a, template_b = _templates(tmp_path)
    image = make_snapshot(tmp_path / "a" / "snapshots", template_a, template_a.machine)
    pinned = publish_snapshot(store, image, template_a).manifest_sha256
    _replace_consistently(store, "snapshots/snap-1", b"evil device state")

    gets = store.stats.gets
    with pytest.raises(IntegrityError, match="not the one the registry pins") as refused:
        import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b, pinned)
    assert refused.value.code == "store_integrity" and refused.value.details["expected"] == {"sha256": pinned}
    assert store.stats.gets == gets + 1, "refused on the manifest: no object was fetched"
    assert _empty(tmp_path / "b" / "snapshots"), "nothing installed"

    # without the registry's pin the per-object pins are satisfied: this is the attack the pin stops
    with caplog.at_level(logging.WARNING, logger="cryobox.objstore.manifests"):
        local = import_snapshot(store, "snap-1", tmp_path / "c" / "snapshots", template_b)
    assert (local / "vmstate").read_bytes() == b"evil device state"
    assert "no pinned hash in the registry" in caplog.text


def test_an_unpinned_legacy_snapshot_still_imports_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = file_store(tmp_path)
    template_a, template_b = _templates(tmp_path)
    publish_snapshot(store, make_snapshot(tmp_path / "a" / "snapshots", template_a, template_a.machine), template_a)
    with caplog.at_level(logging.WARNING, logger="cryobox.objstore.manifests"):
        local = import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b, None)
    assert (local / "vmstate").read_bytes() == b"device state"
    assert [r.levelno for r in caplog.records if "snapshot snap-1" in r.getMessage()] == [logging.WARNING]
    # the import records the hash of the manifest it fetched (what the agent reports if asked to store it)
    assert recorded_manifest(local, SNAP) == _sha(store, SNAP)


def test_a_pinned_import_checks_the_bytes_before_parsing_them(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template_a, template_b = _templates(tmp_path)
    image = make_snapshot(tmp_path / "a" / "snapshots", template_a, template_a.machine)
    pinned = publish_snapshot(store, image, template_a).manifest_sha256
    genuine = store.get(SNAP)
    store.put(SNAP, b"\x00 not json at all")
    with pytest.raises(IntegrityError, match="registry pins"):  # not a JSON error: never parsed
        import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b, pinned)
    store.put(SNAP, genuine)
    local = import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b, pinned)
    assert (local / "vmstate").read_bytes() == b"device state"


def test_a_hibernation_manifest_replaced_with_its_pins_does_not_wake(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template_a, template_b = _templates(tmp_path)
    image = make_hibernation(tmp_path / "a" / "hibernate", "sb-1.h1", template_a, template_a.machine, b"page")
    published = publish_hibernation(store, "sb-1", image, template_a)
    assert published.manifest_sha256 == _sha(store, HIB) == recorded_manifest(image.path, HIB)
    assert (image.path / STORED_MANIFEST).is_file()
    puts = store.stats.puts
    assert publish_hibernation(store, "sb-1", image, template_a) == published
    assert store.stats.puts == puts

    _replace_consistently(store, "hibernations/sb-1", b"evil device state")
    root = tmp_path / "b" / "hibernate"
    with pytest.raises(IntegrityError, match="hibernation of sb-1"):
        import_hibernation(store, "sb-1", root, template_b, published.manifest_sha256)
    assert _empty(root), "nothing installed"

    legacy = import_hibernation(store, "sb-1", tmp_path / "c", template_b)  # unpinned: trusted as fetched
    assert (tmp_path / "c" / legacy / "vmstate").read_bytes() == b"evil device state"

    # publishing again repairs the store (the manifest there is not the recorded one) and answers its new hash
    repaired = publish_hibernation(store, "sb-1", image, template_a)
    assert repaired.manifest_sha256 == _sha(store, HIB) != published.manifest_sha256
    woken = import_hibernation(store, "sb-1", tmp_path / "d", template_b, repaired.manifest_sha256)
    assert (tmp_path / "d" / woken / "vmstate").read_bytes() == b"device state page"
