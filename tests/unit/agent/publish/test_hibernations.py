"""Hibernation images through the object store (``agent/publish/hibernations.py``; memory://, qemu-img, no root):
published once per image, replaced by a later one, imported whole (memory included) onto another host's template,
refused across template generations, deleted manifest first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cryobox.agent.publish.hibernations import (
    delete_hibernation,
    import_hibernation,
    publish_hibernation,
    stored_manifest,
)
from cryobox.errors import ObjectNotFound, StateError
from cryobox.objstore.client import open_store
from tests.support.images import backing_file, machine_config, make_hibernation, make_template


def test_a_stored_hibernation_imports_whole_onto_another_hosts_template(tmp_path: Path) -> None:
    store = open_store("memory://")
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    image = make_hibernation(tmp_path / "a" / "hibernate", "sb-1.h1", template_a, machine, b"first")
    assert publish_hibernation(store, "sb-1", image, template_a).key == "hibernations/sb-1"
    keys = sorted(store.list("hibernations/sb-1"))
    assert keys == [f"hibernations/sb-1/{n}" for n in ("disk.qcow2", "manifest.json", "memory.idx", "vmstate")]
    put = store.stats.puts
    publish_hibernation(store, "sb-1", image, template_a)
    assert store.stats.puts == put  # the same image: nothing uploaded again

    machine_b = machine_config(tmp_path / "b")
    template_b = make_template(tmp_path / "b" / "templates", machine_b, "g1")  # the same generation, elsewhere
    root = tmp_path / "b" / "hibernate"
    image_id = import_hibernation(store, "sb-1", root, template_b)
    local = root / image_id
    assert image_id.startswith("sb-1.h") and image_id != "sb-1.h1"
    assert backing_file(local / "disk.qcow2") == str(template_b.disk)
    assert (local / "memory").read_bytes() == (image.path / "memory").read_bytes()  # home, not paged
    assert (local / "vmstate").read_bytes() == b"device state first"
    manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["id"] == image_id and "memory_prefix" not in manifest
    assert manifest["machine"]["kernel"] == str(machine_b.kernel)
    assert [p.name for p in root.iterdir()] == [image_id]  # no work directory left

    later = make_hibernation(tmp_path / "a" / "hibernate", "sb-1.h2", template_a, machine, b"second")
    publish_hibernation(store, "sb-1", later, template_a)  # a later hibernation replaces it
    assert stored_manifest(store, "sb-1")["id"] == "sb-1.h2"  # type: ignore[index]
    again = import_hibernation(store, "sb-1", tmp_path / "c", template_b)
    assert (tmp_path / "c" / again / "vmstate").read_bytes() == b"device state second"

    assert len(delete_hibernation(store, "sb-1")) == 4 and store.list("hibernations") == []  # chunks stay: GC
    assert stored_manifest(store, "sb-1") is None
    with pytest.raises(ObjectNotFound):
        import_hibernation(store, "sb-1", tmp_path / "d", template_b)
    assert delete_hibernation(store, "sb-1") == []


def test_a_hibernation_over_another_generation_does_not_move(tmp_path: Path) -> None:
    store = open_store("memory://")
    machine = machine_config(tmp_path)
    old = make_template(tmp_path / "t", machine, "g1")
    new = make_template(tmp_path / "t", machine, "g2")
    image = make_hibernation(tmp_path / "h", "sb-1.h1", old, machine, b"x")
    with pytest.raises(StateError, match="current generation"):
        publish_hibernation(store, "sb-1", image, new)
    assert store.list("hibernations") == []
    publish_hibernation(store, "sb-1", image, old)
    with pytest.raises(StateError, match="this host serves"):
        import_hibernation(store, "sb-1", tmp_path / "other", new)
    assert not (tmp_path / "other").exists() or list((tmp_path / "other").iterdir()) == []
