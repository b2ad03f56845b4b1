"""Where a restore's RAM comes from: the hot tmpfs copy of a local image, or the memory server's file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cryobox.agent.memory.client import MemoryServerProcess, MemServerConfig
from cryobox.agent.memory.hot import HotBudgetExceeded, HotImages
from cryobox.agent.memory.settings import MemoryMode
from cryobox.agent.sandbox.memsource import MemorySource
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import Accel, MachineConfig
from cryobox.errors import IntegrityError, VmmError

MACHINE = MachineConfig(
    memory_mib=16, cpus=1, accel=Accel.TCG, kernel=Path("/k"), initrd=Path("/i"), tsc_khz=1, norandmaps=True
)
SHA = "ab" * 32


def pins(prefix: str) -> dict[str, dict[str, dict[str, object]]]:
    """A manifest's pins for the chunk index stored under ``prefix``."""
    return {"pins": {f"{prefix}/memory.idx": {"size": 100, "sha256": SHA}}}


def memserver(tmp_path: Path) -> MemoryServerProcess:
    return MemoryServerProcess(MemServerConfig(tmp_path / "ms", "memory://", tmp_path / "chunks", 1 << 30))


def template(tmp_path: Path, local_memory: bool, pinned: bool = True) -> Template:
    path = tmp_path / "base-g1"
    path.mkdir(exist_ok=True)
    if local_memory:
        (path / "memory").write_bytes(b"\0" * 4096)
    return Template("base", "g1", path, MACHINE, pins("templates/base/g1") if pinned else {})


def snapshot(tmp_path: Path, remote: str | None) -> SnapshotImage:
    path = tmp_path / "snap-1"
    path.mkdir(exist_ok=True)
    if remote is None:
        (path / "memory").write_bytes(b"\0" * 4096)
    manifest = {"memory_prefix": remote, **pins(remote)} if remote else {}
    return SnapshotImage("snap-1", path, MACHINE, manifest)


def test_hot_mode_maps_local_images_from_tmpfs_and_pages_the_rest(tmp_path: Path) -> None:
    hot = HotImages(tmp_path / "hot")
    hot.wipe()
    source = MemorySource(hot, memserver(tmp_path), MemoryMode.HOT, prefetch=False)
    local = template(tmp_path, local_memory=True)
    assert source.prefix(local) is None
    backing = asyncio.run(source.backing(local))
    assert backing.path == hot.path(local.hot_key) and backing.write_trackable
    assert source.prefix(local, lazy=True) == "templates/base/g1"  # forced (the prefetch trace recording)
    (tmp_path / "fetched").mkdir()
    fetched = template(tmp_path / "fetched", local_memory=False)
    lazy = asyncio.run(source.backing(fetched))
    assert lazy.path == tmp_path / "ms" / "mnt" / f"templates+base+g1@{SHA}"  # named with its index pin
    assert not lazy.write_trackable and not lazy.share
    assert source.prefix(snapshot(tmp_path, None)) is None
    (tmp_path / "imported").mkdir()
    assert source.prefix(snapshot(tmp_path / "imported", "snapshots/snap-1")) == "snapshots/snap-1"
    assert source.image_name(snapshot(tmp_path / "imported", "snapshots/snap-1")) == f"snapshots+snap-1@{SHA}"


def test_lazy_mode_pages_templates_but_not_local_snapshots(tmp_path: Path) -> None:
    source = MemorySource(HotImages(tmp_path / "hot"), memserver(tmp_path), MemoryMode.LAZY, prefetch=False)
    assert source.prefix(template(tmp_path, local_memory=True)) == "templates/base/g1"
    assert source.prefix(snapshot(tmp_path, None)) is None  # a local snapshot is not in the store


def test_without_a_memory_server_everything_is_local(tmp_path: Path) -> None:
    source = MemorySource(HotImages(tmp_path / "hot"), None, MemoryMode.HOT)
    assert source.prefix(template(tmp_path, local_memory=False)) is None


def test_a_snapshot_being_made_durable_restores_from_its_hot_copy(tmp_path: Path) -> None:
    hot = HotImages(tmp_path / "hot")
    hot.wipe()
    source = MemorySource(hot, memserver(tmp_path), MemoryMode.HOT, prefetch=False)
    capturing = SnapshotImage("snap-2", tmp_path / "snap-2", MACHINE, {})  # no memory file yet (fork_tree)
    hot.path("snap-2").parent.mkdir(parents=True)
    hot.path("snap-2").write_bytes(b"\0" * 4096)
    backing = asyncio.run(source.backing(capturing))
    assert backing.path == hot.path("snap-2") and backing.write_trackable
    with pytest.raises(VmmError, match="no memory image"):
        asyncio.run(source.backing(SnapshotImage("gone", tmp_path / "gone", MACHINE, {})))


def test_a_source_whose_manifest_pins_no_index_is_not_paged_from_the_store(tmp_path: Path) -> None:
    source = MemorySource(HotImages(tmp_path / "hot"), memserver(tmp_path), MemoryMode.LAZY, prefetch=False)
    unpinned = template(tmp_path, local_memory=False, pinned=False)
    with pytest.raises(IntegrityError, match="templates/base/g1/memory.idx"):
        asyncio.run(source.backing(unpinned))
    other = Template("base", "g1", unpinned.path, MACHINE, pins("templates/base/g0"))  # another image's pin
    with pytest.raises(IntegrityError, match="pins no hash"):
        source.image_name(other)
    assert source.image_name(template(tmp_path, local_memory=False)) == f"templates+base+g1@{SHA}"


def test_a_full_hot_budget_falls_back_to_the_memory_server_only_with_a_pin(tmp_path: Path) -> None:
    hot = HotImages(tmp_path / "hot", budget_bytes=0)
    hot.wipe()
    source = MemorySource(hot, memserver(tmp_path), MemoryMode.HOT, prefetch=False)
    backing = asyncio.run(source.backing(template(tmp_path, local_memory=True)))
    assert backing.path.name == f"templates+base+g1@{SHA}" and not backing.write_trackable
    with pytest.raises(HotBudgetExceeded):
        asyncio.run(source.backing(template(tmp_path, local_memory=True, pinned=False)))


def test_the_memory_server_client_maps_pinned_names_only(tmp_path: Path) -> None:
    client = memserver(tmp_path)
    assert client.path_for(f"templates+base+g1@{SHA}") == tmp_path / "ms" / "mnt" / f"templates+base+g1@{SHA}"
    for name in ("templates+base+g1", "templates+base+g1@", "templates+base+g1@xyz"):
        with pytest.raises(ValueError, match="no index pin"):
            client.path_for(name)
    assert client.config.argv()[-2:] == ["--pinned-names", "--content-chunks"]
