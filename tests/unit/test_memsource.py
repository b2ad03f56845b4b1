"""Where a restore's RAM comes from: the hot tmpfs copy of a local image, or the memory server's file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cryobox.agent.memsource import MemorySource
from cryobox.agent.storage import MemoryMode
from cryobox.agent.store.hot import HotImages
from cryobox.agent.store.memclient import MemoryServerProcess, MemServerConfig
from cryobox.agent.store.snapshots import SnapshotImage
from cryobox.agent.templates import Template
from cryobox.agent.vm import Accel, MachineConfig
from cryobox.errors import VmmError

MACHINE = MachineConfig(
    memory_mib=16, cpus=1, accel=Accel.TCG, kernel=Path("/k"), initrd=Path("/i"), tsc_khz=1, norandmaps=True
)


def memserver(tmp_path: Path) -> MemoryServerProcess:
    return MemoryServerProcess(MemServerConfig(tmp_path / "ms", "memory://", tmp_path / "chunks", 1 << 30))


def template(tmp_path: Path, local_memory: bool) -> Template:
    path = tmp_path / "base-g1"
    path.mkdir(exist_ok=True)
    if local_memory:
        (path / "memory").write_bytes(b"\0" * 4096)
    return Template("base", "g1", path, MACHINE, {})


def snapshot(tmp_path: Path, remote: str | None) -> SnapshotImage:
    path = tmp_path / "snap-1"
    path.mkdir(exist_ok=True)
    if remote is None:
        (path / "memory").write_bytes(b"\0" * 4096)
    manifest = {"memory_prefix": remote} if remote else {}
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
    assert lazy.path == tmp_path / "ms" / "mnt" / "templates+base+g1"
    assert not lazy.write_trackable and not lazy.share
    assert source.prefix(snapshot(tmp_path, None)) is None
    (tmp_path / "imported").mkdir()
    assert source.prefix(snapshot(tmp_path / "imported", "snapshots/snap-1")) == "snapshots/snap-1"


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
