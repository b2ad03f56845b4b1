"""A host's volume images: made with a real ``mkfs.ext4`` on a sparse file in a temp dir, grown (never shrunk),
removed; a failed format leaves nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from cryobox.agent.volumes.store import VolumeStore, used_bytes
from cryobox.agentapi.models_volumes import VolumeSpec
from cryobox.errors import HostUnavailable, InvalidArgument, NotFound

MIB = 1 << 20


def label_of(path: Path) -> str:
    done = subprocess.run(["blkid", "-p", "-o", "value", "-s", "LABEL", str(path)], capture_output=True, text=True)
    return done.stdout.strip()


async def test_a_volume_is_a_sparse_ext4_image_labelled_and_grows_only(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path / "volumes")
    spec = VolumeSpec(volume_id="vol-0123456789ab", size_bytes=64 * MIB, label="fcvol-dataset")
    info = await store.create(spec)
    path = store.path(spec.volume_id)
    assert info.size_bytes == 64 * MIB and path.stat().st_size == 64 * MIB
    assert info.allocated_bytes >= 64 * MIB  # allocated in full: a guest filling it never fills the host
    assert info.used_bytes is not None and 0 < info.used_bytes < 16 * MIB  # a fresh file system: its metadata
    assert label_of(path) == "fcvol-dataset"
    assert await store.create(spec) == store.info(spec.volume_id)  # a retried create answers the same image
    assert store.ids() == [spec.volume_id] and not list(path.parent.glob("*.partial"))
    assert store.grow(spec.volume_id, 128 * MIB).size_bytes == 128 * MIB
    with pytest.raises(InvalidArgument):
        store.grow(spec.volume_id, 32 * MIB)
    assert path.stat().st_size == 128 * MIB
    store.delete(spec.volume_id)
    store.delete(spec.volume_id)  # idempotent
    with pytest.raises(NotFound):
        store.info(spec.volume_id)
    with pytest.raises(InvalidArgument):
        store.path("../../etc/passwd")


async def test_no_room_on_the_data_volume_is_a_503_and_makes_nothing(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path / "volumes")
    free = shutil.disk_usage(tmp_path).free
    too_big = VolumeSpec(volume_id="vol-0123456789ab", size_bytes=min(free, 1 << 40), label="x")
    with pytest.raises(HostUnavailable):
        await store.create(too_big)
    assert store.ids() == [] and not list((tmp_path / "volumes").iterdir())


def test_used_bytes_reads_only_an_ext4_superblock(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(4096))
    assert used_bytes(junk) is None
    assert used_bytes(tmp_path / "missing") is None


async def test_a_failed_format_leaves_nothing(tmp_path: Path) -> None:
    async def failing(argv: Sequence[str]) -> None:
        raise RuntimeError(f"{argv[0]} failed")

    store = VolumeStore(tmp_path / "volumes", run=failing)
    with pytest.raises(RuntimeError):
        await store.create(VolumeSpec(volume_id="vol-0123456789ab", size_bytes=16 * MIB, label="x"))
    assert list((tmp_path / "volumes").iterdir()) == []
