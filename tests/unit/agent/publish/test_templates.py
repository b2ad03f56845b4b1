"""Images and snapshots through the object store (memory:// and file:// stores; qemu-img for the overlays, no
root): chunks stored once by sha256, only the missing ones uploaded, indexes of the earlier format refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cryobox.agent.publish.templates import download_image, import_snapshot, publish_snapshot, upload_image
from cryobox.errors import StateError, StoreError
from cryobox.objstore.chunkfmt import CHUNK_SIZE
from cryobox.objstore.client import open_store
from cryobox.objstore.pins import PinSet
from tests.support.images import backing_file, machine_config, make_snapshot, make_template, sparse_image


def test_upload_then_download_rebuilds_the_sparse_image(tmp_path: Path) -> None:
    store = open_store("memory://")
    src = tmp_path / "src"
    sparse_image(src, 6, {0: os.urandom(5000), 3: os.urandom(CHUNK_SIZE - 100)})
    pins = PinSet()
    index = upload_image(store, "images/x/rootfs", src, "gen", pins)
    assert [index.is_zero(i) for i in range(6)] == [False, True, True, False, True, True]
    assert index.stored_bytes == 2 * CHUNK_SIZE
    assert store.list("images/x") == ["images/x/rootfs.idx"]
    assert sorted(store.list("chunks")) == sorted(index.key(i) for i in (0, 3))
    dest = tmp_path / "out" / "rootfs"
    download_image(store, "images/x/rootfs", dest, PinSet.from_manifest({"pins": pins.to_json()}, "test"))
    assert dest.read_bytes() == src.read_bytes()
    assert dest.stat().st_blocks * 512 < 3 * CHUNK_SIZE, "zero chunks stay holes"
    assert not list(dest.parent.glob(".*")), "no temp file left behind"


def test_download_refuses_bytes_that_do_not_match_the_index(tmp_path: Path) -> None:
    store = open_store("memory://")
    src = tmp_path / "src"
    sparse_image(src, 2, {1: b"payload"})
    pins = PinSet()
    index = upload_image(store, "m/memory", src, "gen", pins)
    chunk = bytearray(store.get(index.key(1)))
    chunk[200] ^= 0xFF
    store.put(index.key(1), bytes(chunk))
    with pytest.raises(StoreError, match="checksum"):
        download_image(store, "m/memory", tmp_path / "dest", pins)
    assert not (tmp_path / "dest").exists()


def test_a_published_snapshot_imports_onto_another_hosts_template(tmp_path: Path) -> None:
    store = open_store("memory://")
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    image = make_snapshot(tmp_path / "a" / "snapshots", template_a, machine)
    assert publish_snapshot(store, image, template_a).key == "snapshots/snap-1"

    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")  # the same generation, elsewhere
    local = import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)
    assert backing_file(local / "disk.qcow2") == str(template_b.disk)
    assert (local / "vmstate").read_bytes() == b"device state"
    assert not (local / "memory").exists(), "the memory stays in the store"
    manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["memory_prefix"] == "snapshots/snap-1" and manifest["template_generation"] == "g1"
    with pytest.raises(StateError, match="already"):
        import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)


def test_snapshots_of_another_template_generation_are_refused(tmp_path: Path) -> None:
    store = open_store("memory://")
    machine = machine_config(tmp_path)
    old = make_template(tmp_path / "t", machine, "g1")
    new = make_template(tmp_path / "t", machine, "g2")
    image = make_snapshot(tmp_path / "s", old, machine)
    with pytest.raises(StateError, match="current generation"):
        publish_snapshot(store, image, new)
    assert store.list("snapshots") == []
    publish_snapshot(store, image, old)
    with pytest.raises(StateError, match="this host serves"):
        import_snapshot(store, "snap-1", tmp_path / "other", new)
    assert not (tmp_path / "other" / "snap-1").exists()
