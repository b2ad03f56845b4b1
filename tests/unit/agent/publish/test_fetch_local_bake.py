"""``fetch_template`` onto a templates dir that already holds the published generation (a file:// store; no QEMU).

A host that baked a generation itself (a cache dir shared with the building host) has a manifest without
``machine_config``: it is served as is, its machine config taken from the published manifest with the local
kernel and initrd. One fetched before (its manifest carries ``machine_config``) is loaded as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.publish.templates import fetch_template
from cryobox.agent.vm import Accel, MachineConfig
from cryobox.errors import StoreError
from cryobox.objstore.client import ObjectStore, open_store

QEMU = "QEMU emulator version 8.2.2"


def _machine(kernel: Path, initrd: Path) -> MachineConfig:
    return MachineConfig(
        memory_mib=512,
        cpus=2,
        accel=Accel.TCG,
        kernel=kernel,
        initrd=initrd,
        tsc_khz=2_000_000,
        norandmaps=True,
        nic=True,
    )


def _published_store(root: Path, generation: str) -> tuple[ObjectStore, MachineConfig]:
    """A store where ``base`` ``generation`` is published from another host (its kernel paths are that host's).
    Only the manifest and ``latest``: any download the fetch attempted would fail."""
    store = open_store(f"file://{root / 'store'}")
    builder = _machine(Path("/builder/images/kernel/k1/vmlinuz"), Path("/builder/images/initrd/i1/initrd.img"))
    manifest = {
        "name": "base",
        "generation": generation,
        "qemu": QEMU,
        "layout": 2,
        "machine": builder.identity(),
        "machine_config": builder.to_json(),
        "files": {
            "kernel": "images/kernel/k1/vmlinuz",
            "initrd": "images/initrd/i1/initrd.img",
            "rootfs": "images/rootfs/r1/rootfs.img",
        },
    }
    store.put(f"templates/base/{generation}/manifest.json", json.dumps(manifest).encode())
    store.put("templates/base/latest", json.dumps({"generation": generation}).encode())
    return store, builder


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_local_bake_of_the_published_generation_is_served_as_is(tmp_path: Path) -> None:
    store, builder = _published_store(tmp_path, "g1")
    templates_dir, images_dir = tmp_path / "cache" / "templates", tmp_path / "cache" / "images"
    kernel, initrd = images_dir / "kernel" / "k1" / "vmlinuz", images_dir / "initrd" / "i1" / "initrd.img"
    local = templates_dir / "base-g1"
    baked = {
        "name": "base",
        "generation": "g1",
        "kernel": str(kernel),
        "initrd": str(initrd),
        "machine": builder.identity(),
    }
    _write_manifest(local, baked)
    messages: list[str] = []

    template = fetch_template(store, "base", templates_dir, images_dir, QEMU, messages.append)

    assert (template.name, template.generation, template.path) == ("base", "g1", local)
    assert template.machine == MachineConfig.from_json(dict(builder.to_json(), kernel=str(kernel), initrd=str(initrd)))
    assert (template.machine.memory_mib, template.machine.cpus, template.machine.nic) == (512, 2, True)
    assert template.manifest == baked
    assert json.loads((local / "manifest.json").read_text()) == baked, "the local bake is left as it is"
    assert messages == [] and not images_dir.exists(), "nothing is fetched"
    assert sorted(p.name for p in templates_dir.iterdir()) == ["base-g1"]


def test_a_previously_fetched_template_is_loaded_as_before(tmp_path: Path) -> None:
    store, builder = _published_store(tmp_path, "g1")
    templates_dir, images_dir = tmp_path / "cache" / "templates", tmp_path / "cache" / "images"
    kernel, initrd = images_dir / "kernel" / "k1" / "vmlinuz", images_dir / "initrd" / "i1" / "initrd.img"
    local = templates_dir / "base-g1"
    machine = dict(builder.to_json(), kernel=str(kernel), initrd=str(initrd))
    fetched = {
        "name": "base",
        "generation": "g1",
        "qemu": QEMU,
        "machine": builder.identity(),
        "machine_config": machine,
        "kernel": str(kernel),
        "initrd": str(initrd),
        "memory_prefix": "templates/base/g1",
        "fetched_from": store.url,
        "layout": 2,
    }
    _write_manifest(local, fetched)
    messages: list[str] = []

    template = fetch_template(store, "base", templates_dir, images_dir, QEMU, messages.append)

    assert (template.name, template.generation, template.path) == ("base", "g1", local)
    assert template.machine == MachineConfig.from_json(machine)
    assert template.manifest == fetched
    assert messages == [] and not images_dir.exists(), "nothing is fetched"


def test_a_template_the_store_holds_in_the_earlier_layout_is_refused_saying_so(tmp_path: Path) -> None:
    """One memory.pack per image (layout 1): its memory could not be paged; the fetch says what to do. A copy
    fetched in that layout earlier is not served as is either: it is fetched again (and so refused here)."""
    store, _ = _published_store(tmp_path, "g1")
    manifest = json.loads(store.get("templates/base/g1/manifest.json"))
    store.put("templates/base/g1/manifest.json", json.dumps({**manifest, "layout": 1}).encode())
    templates_dir, images_dir = tmp_path / "cache" / "templates", tmp_path / "cache" / "images"
    with pytest.raises(StoreError, match="layout 1 .*publish it again"):
        fetch_template(store, "base", templates_dir, images_dir, QEMU, lambda _: None)
    _write_manifest(templates_dir / "base-g1", {**manifest, "layout": 1})  # fetched by an earlier version
    with pytest.raises(StoreError, match="layout 1"):
        fetch_template(store, "base", templates_dir, images_dir, QEMU, lambda _: None)
    assert not images_dir.exists()


def test_a_local_bake_without_recorded_pins_gets_the_published_ones(tmp_path: Path) -> None:
    """Lazy restores of it name the memory index by its pin: the building host may not have recorded its pins
    yet (it records them after publishing), so they come from the published manifest; the file is left alone."""
    store, builder = _published_store(tmp_path, "g1")
    manifest = json.loads(store.get("templates/base/g1/manifest.json"))
    pins = {"templates/base/g1/memory.idx": {"size": 10, "sha256": "cd" * 32}}
    store.put("templates/base/g1/manifest.json", json.dumps({**manifest, "pins": pins}).encode())
    templates_dir, images_dir = tmp_path / "cache" / "templates", tmp_path / "cache" / "images"
    local = templates_dir / "base-g1"
    baked = {"name": "base", "generation": "g1", "kernel": "/k", "initrd": "/i", "machine": builder.identity()}
    _write_manifest(local, baked)

    template = fetch_template(store, "base", templates_dir, images_dir, QEMU, lambda _: None)
    assert template.manifest == {**baked, "pins": pins}
    assert json.loads((local / "manifest.json").read_text()) == baked

    recorded = {**baked, "pins": {"templates/base/g1/memory.idx": {"size": 10, "sha256": "ef" * 32}}}
    (local / "manifest.json").write_text(json.dumps(recorded))  # pins recorded locally win
    assert fetch_template(store, "base", templates_dir, images_dir, QEMU, lambda _: None).manifest == recorded
