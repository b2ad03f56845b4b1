"""Images and snapshots through the object store (memory:// and file:// stores; qemu-img for the overlays, no
root): chunks stored once by sha256, only the missing ones uploaded, indexes of the earlier format refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cryobox.agent.publish.templates import download_image, import_snapshot, publish_snapshot, upload_image
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import Accel, MachineConfig
from cryobox.errors import StateError, StoreError
from cryobox.objstore.chunkfmt import CHUNK_SIZE
from cryobox.objstore.client import open_store
from cryobox.objstore.pins import PinSet


def sparse_image(path: Path, chunks: int, data: dict[int, bytes]) -> None:
    with open(path, "wb") as fh:
        fh.truncate(chunks * CHUNK_SIZE)
        for i, blob in data.items():
            fh.seek(i * CHUNK_SIZE + 100)
            fh.write(blob)


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


def _machine(tmp_path: Path) -> MachineConfig:
    return MachineConfig(
        memory_mib=16,
        cpus=1,
        accel=Accel.TCG,
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
        tsc_khz=1,
        norandmaps=True,
    )


def _qcow2(path: Path, backing: Path | None = None) -> None:
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if backing is not None:
        argv += ["-F", "qcow2", "-b", str(backing)]
    else:
        argv += [str(path), "64M"]
        subprocess.run(argv, check=True)
        return
    subprocess.run([*argv, str(path)], check=True)


def _template(root: Path, machine: MachineConfig, generation: str) -> Template:
    path = root / f"base-{generation}"
    path.mkdir(parents=True)
    _qcow2(path / "disk.qcow2")
    return Template("base", generation, path, machine, {"name": "base", "generation": generation})


def _snapshot(root: Path, template: Template, machine: MachineConfig) -> SnapshotImage:
    path = root / "snap-1"
    path.mkdir(parents=True)
    _qcow2(path / "disk.qcow2", template.disk)
    (path / "vmstate").write_bytes(b"device state")
    sparse_image(path / "memory", 4, {2: b"guest page"})
    manifest = {"id": "snap-1", "template": "base", "machine": machine.to_json(), "created_at": 1.0}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return SnapshotImage("snap-1", path, machine, manifest)


def _backing(disk: Path) -> str:
    out = subprocess.run(["qemu-img", "info", "--output=json", "-U", str(disk)], capture_output=True, text=True)
    return str(json.loads(out.stdout)["backing-filename"])


def test_a_published_snapshot_imports_onto_another_hosts_template(tmp_path: Path) -> None:
    store = open_store("memory://")
    machine = _machine(tmp_path)
    template_a = _template(tmp_path / "a" / "templates", machine, "g1")
    image = _snapshot(tmp_path / "a" / "snapshots", template_a, machine)
    assert publish_snapshot(store, image, template_a, tmp_path / "work").key == "snapshots/snap-1"

    template_b = _template(tmp_path / "b" / "templates", machine, "g1")  # the same generation, elsewhere
    local = import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)
    assert _backing(local / "disk.qcow2") == str(template_b.disk)
    assert (local / "vmstate").read_bytes() == b"device state"
    assert not (local / "memory").exists(), "the memory stays in the store"
    manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["memory_prefix"] == "snapshots/snap-1" and manifest["template_generation"] == "g1"
    with pytest.raises(StateError, match="already"):
        import_snapshot(store, "snap-1", tmp_path / "b" / "snapshots", template_b)


def test_snapshots_of_another_template_generation_are_refused(tmp_path: Path) -> None:
    store = open_store("memory://")
    machine = _machine(tmp_path)
    old = _template(tmp_path / "t", machine, "g1")
    new = _template(tmp_path / "t", machine, "g2")
    image = _snapshot(tmp_path / "s", old, machine)
    with pytest.raises(StateError, match="current generation"):
        publish_snapshot(store, image, new, tmp_path / "work")
    assert store.list("snapshots") == []
    publish_snapshot(store, image, old, tmp_path / "work")
    with pytest.raises(StateError, match="this host serves"):
        import_snapshot(store, "snap-1", tmp_path / "other", new)
    assert not (tmp_path / "other" / "snap-1").exists()
