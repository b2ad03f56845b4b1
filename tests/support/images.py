"""Templates, snapshots and hibernation images on tmp paths, as a host's publish and fetch see them: sparse
raw images, qcow2 overlays made by qemu-img, manifests, and a file:// store (no QEMU VM)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cryobox.agent.publish.templates import fetch_template
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import Accel, MachineConfig
from cryobox.objstore.chunkfmt import CHUNK_SIZE
from cryobox.objstore.client import ObjectStore, open_store


def sparse_image(path: Path, chunks: int, data: dict[int, bytes]) -> None:
    with open(path, "wb") as fh:
        fh.truncate(chunks * CHUNK_SIZE)
        for i, blob in data.items():
            fh.seek(i * CHUNK_SIZE + 100)
            fh.write(blob)


def machine_config(tmp_path: Path) -> MachineConfig:
    return MachineConfig(
        memory_mib=16,
        cpus=1,
        accel=Accel.TCG,
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
        tsc_khz=1,
        norandmaps=True,
    )


def make_qcow2(path: Path, backing: Path | None = None) -> None:
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if backing is not None:
        argv += ["-F", "qcow2", "-b", str(backing)]
    else:
        argv += [str(path), "64M"]
        subprocess.run(argv, check=True)
        return
    subprocess.run([*argv, str(path)], check=True)


def make_template(root: Path, machine: MachineConfig, generation: str) -> Template:
    path = root / f"base-{generation}"
    path.mkdir(parents=True)
    make_qcow2(path / "disk.qcow2")
    return Template("base", generation, path, machine, {"name": "base", "generation": generation})


def make_snapshot(root: Path, template: Template, machine: MachineConfig) -> SnapshotImage:
    path = root / "snap-1"
    path.mkdir(parents=True)
    make_qcow2(path / "disk.qcow2", template.disk)
    (path / "vmstate").write_bytes(b"device state")
    sparse_image(path / "memory", 4, {2: b"guest page"})
    manifest = {"id": "snap-1", "template": "base", "machine": machine.to_json(), "created_at": 1.0}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return SnapshotImage("snap-1", path, machine, manifest)


def backing_file(disk: Path) -> str:
    out = subprocess.run(["qemu-img", "info", "--output=json", "-U", str(disk)], capture_output=True, text=True)
    return str(json.loads(out.stdout)["backing-filename"])


def make_hibernation(
    root: Path, image_id: str, template: Template, machine: MachineConfig, page: bytes
) -> SnapshotImage:
    path = root / image_id
    path.mkdir(parents=True)
    make_qcow2(path / "disk.qcow2", template.disk)
    (path / "vmstate").write_bytes(b"device state " + page)
    sparse_image(path / "memory", 4, {1: page})
    manifest = {"id": image_id, "template": "base", "machine": machine.to_json(), "created_at": 1.0}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return SnapshotImage(image_id, path, machine, manifest)


QEMU_VERSION = "QEMU emulator version 8.2.2"


KERNEL, INITRD, ROOTFS = "kernel/k1/vmlinuz", "initrd/i1/initrd.img", "rootfs/r1/rootfs.img"


def file_store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def baked_template(root: Path, generation: str = "g1") -> Template:
    """A baked template on the publishing host, its kernel, initrd and rootfs in ``root/images``."""
    images = root / "images"
    for rel, data in ((KERNEL, b"kernel " * 999), (INITRD, b"initrd " * 777)):
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        (images / rel).write_bytes(data)
    (images / ROOTFS).parent.mkdir(parents=True, exist_ok=True)
    if not (images / ROOTFS).exists():
        sparse_image(images / ROOTFS, 3, {0: b"rootfs superblock", 2: b"rootfs files"})
    machine = MachineConfig(
        memory_mib=16,
        cpus=1,
        accel=Accel.TCG,
        kernel=images / KERNEL,
        initrd=images / INITRD,
        tsc_khz=1,
        norandmaps=True,
    )
    path = root / "templates" / f"base-{generation}"
    path.mkdir(parents=True)
    make_qcow2(path / "disk.qcow2")
    (path / "vmstate").write_bytes(b"template device state")
    sparse_image(path / "memory", 2, {1: b"guest ram"})
    manifest = {"name": "base", "generation": generation, "qemu": QEMU_VERSION, "rootfs": str(images / ROOTFS)}
    return Template("base", generation, path, machine, manifest)


def fetch_base(store: ObjectStore, tmp_path: Path) -> Template:
    b = tmp_path / "b"
    return fetch_template(store, "base", b / "templates", b / "images", QEMU_VERSION, lambda _: None)
