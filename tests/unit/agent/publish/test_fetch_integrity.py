"""Published objects are pinned in their manifest and checked on fetch (a file:// store; qemu-img, no QEMU VM).

A tampered object (one flipped byte, or a consistent chunk index swapped in with its chunks) is refused with
``IntegrityError`` and nothing is installed at the destination; the untampered round trip still works.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.publish.hibernations import import_hibernation, publish_hibernation
from cryobox.agent.publish.templates import (
    import_snapshot,
    publish_snapshot,
    publish_template,
    upload_image,
)
from cryobox.agent.templates.bake import Template
from cryobox.errors import IntegrityError
from cryobox.objstore.chunkfmt import ChunkIndex
from cryobox.objstore.client import ObjectStore
from cryobox.objstore.pins import PinSet
from tests.support.images import (
    INITRD,
    KERNEL,
    ROOTFS,
    backing_file,
    baked_template,
    fetch_base,
    file_store,
    machine_config,
    make_hibernation,
    make_snapshot,
    make_template,
    sparse_image,
)


def _published(tmp_path: Path) -> tuple[ObjectStore, Template]:
    store = file_store(tmp_path)
    template = baked_template(tmp_path / "a")
    publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    return store, template


def _flip(store_root: Path, key: str, at: int = 0) -> None:
    path = store_root / key
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _manifest(tmp_path: Path, key: str) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "store" / key).read_text()))


def test_publish_pins_every_object_it_fetches_and_the_round_trip_works(tmp_path: Path) -> None:
    store, template = _published(tmp_path)
    pins = _manifest(tmp_path, "templates/base/g1/manifest.json")["pins"]
    assert sorted(pins) == sorted(
        [
            "templates/base/g1/memory.idx",
            "templates/base/g1/vmstate",
            "templates/base/g1/disk.qcow2",
            f"images/{KERNEL}",
            f"images/{INITRD}",
            f"images/{ROOTFS}.idx",
        ]
    )
    assert pins["templates/base/g1/vmstate"]["size"] == len(b"template device state")

    fetched = fetch_base(store, tmp_path)
    assert fetched.vmstate.read_bytes() == b"template device state"
    assert fetched.machine.kernel.read_bytes() == template.machine.kernel.read_bytes()
    assert Path(fetched.manifest["rootfs"]).read_bytes() == Path(template.manifest["rootfs"]).read_bytes()
    assert backing_file(fetched.disk) == fetched.manifest["rootfs"]


def test_a_copy_fetched_in_the_earlier_layout_is_fetched_again(tmp_path: Path) -> None:
    store, _ = _published(tmp_path)
    fetched = fetch_base(store, tmp_path)
    assert fetched.manifest["layout"] == 2 and fetch_base(store, tmp_path).path == fetched.path  # loaded as is
    gets = store.stats.gets
    old = {**fetched.manifest, "layout": 1}
    (fetched.path / "manifest.json").write_text(json.dumps(old))  # as an earlier version fetched it
    again = fetch_base(store, tmp_path)
    assert again.manifest["layout"] == 2 and store.stats.gets > gets + 2  # its small files came again
    assert json.loads((again.path / "manifest.json").read_text())["layout"] == 2


@pytest.mark.parametrize("key", ["templates/base/g1/vmstate", "templates/base/g1/disk.qcow2"])
def test_a_tampered_template_object_is_refused_and_nothing_is_installed(tmp_path: Path, key: str) -> None:
    store, _ = _published(tmp_path)
    _flip(tmp_path / "store", key, at=100 if key.endswith("qcow2") else 3)
    with pytest.raises(IntegrityError, match="does not match its pin") as info:
        fetch_base(store, tmp_path)
    assert info.value.details["key"] == key
    assert list((tmp_path / "b" / "templates").iterdir()) == [], "no template directory, no work directory"


def test_a_tampered_kernel_never_reaches_the_image_cache(tmp_path: Path) -> None:
    store, _ = _published(tmp_path)
    _flip(tmp_path / "store", f"images/{KERNEL}")
    with pytest.raises(IntegrityError):
        fetch_base(store, tmp_path)
    kernel_dir = tmp_path / "b" / "images" / KERNEL
    assert list(kernel_dir.parent.iterdir()) == [], "no kernel, no temp file"
    assert not (tmp_path / "b" / "templates" / "base-g1").exists()


def test_a_consistent_index_and_chunks_swapped_in_for_the_rootfs_are_refused(tmp_path: Path) -> None:
    """Per-chunk checks alone would accept this (the index matches its chunks); the pin of the index does not."""
    store, _ = _published(tmp_path)
    evil = tmp_path / "evil.img"
    sparse_image(evil, 3, {0: b"rootfs superblock", 1: b"a backdoor"})
    other = PinSet()
    upload_image(store, f"images/{ROOTFS}", evil, f"images/{ROOTFS}", other)
    with pytest.raises(IntegrityError, match=f"images/{ROOTFS}.idx"):
        fetch_base(store, tmp_path)
    assert not (tmp_path / "b" / "images" / ROOTFS).parent.exists(), "refused before anything was written"


def test_a_manifest_without_pins_is_refused_before_any_download(tmp_path: Path) -> None:
    store, _ = _published(tmp_path)
    manifest = _manifest(tmp_path, "templates/base/g1/manifest.json")
    del manifest["pins"]
    store.put("templates/base/g1/manifest.json", json.dumps(manifest).encode())
    gets = store.stats.gets
    with pytest.raises(IntegrityError, match="pins no object hashes"):
        fetch_base(store, tmp_path)
    assert store.stats.gets == gets + 2  # latest and the manifest, nothing else
    assert not (tmp_path / "b" / "images").exists()


def test_a_second_template_over_a_stored_rootfs_pins_it_after_checking_it(tmp_path: Path) -> None:
    store, _ = _published(tmp_path)
    second = baked_template(tmp_path / "a", "g2")  # the same rootfs, already in the store
    publish_template(store, second, tmp_path / "a" / "images", lambda _: None)
    first_pins = _manifest(tmp_path, "templates/base/g1/manifest.json")["pins"]
    second_pins = _manifest(tmp_path, "templates/base/g2/manifest.json")["pins"]
    assert second_pins[f"images/{ROOTFS}.idx"] == first_pins[f"images/{ROOTFS}.idx"]
    assert fetch_base(store, tmp_path).generation == "g2"


def test_a_stored_rootfs_index_that_differs_from_the_local_image_is_not_pinned(tmp_path: Path) -> None:
    store, _ = _published(tmp_path)
    evil = tmp_path / "evil.img"
    sparse_image(evil, 3, {0: b"something else"})
    upload_image(store, f"images/{ROOTFS}", evil, f"images/{ROOTFS}", PinSet())
    second = baked_template(tmp_path / "a", "g2")
    with pytest.raises(IntegrityError, match="does not describe the local image"):
        publish_template(store, second, tmp_path / "a" / "images", lambda _: None)
    assert not store.exists("templates/base/g2/manifest.json")


def test_a_tampered_snapshot_overlay_is_not_imported(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    publish_snapshot(store, make_snapshot(tmp_path / "a" / "snapshots", template_a, machine), template_a)
    assert "snapshots/snap-1/memory.idx" in _manifest(tmp_path, "snapshots/snap-1/manifest.json")["pins"]
    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")
    _flip(tmp_path / "store", "snapshots/snap-1/disk.qcow2", at=200)
    with pytest.raises(IntegrityError, match="disk.qcow2"):
        import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)
    assert list((tmp_path / "b" / "snapshots").iterdir()) == []

    _flip(tmp_path / "store", "snapshots/snap-1/disk.qcow2", at=200)  # put it back: the import works
    local = import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)
    assert (local / "vmstate").read_bytes() == b"device state"


def test_a_hibernation_with_a_flipped_index_byte_does_not_wake(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    image = make_hibernation(tmp_path / "a" / "hibernate", "sb-1.h1", template_a, machine, b"page")
    publish_hibernation(store, "sb-1", image, template_a)
    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")
    idx = tmp_path / "store" / "hibernations/sb-1/memory.idx"
    data = bytearray(idx.read_bytes())
    at = data.index(b'"sha256":["",') + 14  # the first digest of a stored chunk (chunk 0 is a zero chunk)
    data[at] = ord("0") if data[at] != ord("0") else ord("1")  # still hex: still a well-formed index
    idx.write_bytes(bytes(data))
    ChunkIndex.from_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="memory.idx"):
        import_hibernation(store, "sb-1", tmp_path / "b" / "hibernate", template_b)
    assert list((tmp_path / "b" / "hibernate").iterdir()) == []


def test_a_hibernation_whose_vmstate_grew_does_not_wake(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    image = make_hibernation(tmp_path / "a" / "hibernate", "sb-1.h1", template_a, machine, b"page")
    publish_hibernation(store, "sb-1", image, template_a)
    store.put("hibernations/sb-1/vmstate", image.vmstate.read_bytes() + os.urandom(16))
    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")
    with pytest.raises(IntegrityError, match="vmstate"):
        import_hibernation(store, "sb-1", tmp_path / "b" / "hibernate", template_b)
    assert list((tmp_path / "b" / "hibernate").iterdir()) == []
    store.put("hibernations/sb-1/vmstate", image.vmstate.read_bytes())
    image_id = import_hibernation(store, "sb-1", tmp_path / "b" / "hibernate", template_b)
    assert (tmp_path / "b" / "hibernate" / image_id / "memory").read_bytes() == image.memory.read_bytes()
