"""Volume clones for fork children: a clone holds its source's bytes, allocated in full (a sparse copy where the
file system cannot reflink); a failed batch leaves none of its clones; an image id a host holds is never a clone's
target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cryobox.agent.volumes.clones import VolumeClone, drop_clones, make_clones
from cryobox.agent.volumes.store import VolumeStore
from cryobox.errors import StateError

MIB = 1 << 20


def _source(path: Path) -> Path:
    with open(path, "wb") as fh:
        fh.write(b"superblock")
        fh.seek(3 * MIB)
        fh.write(b"a file's data")
        fh.truncate(4 * MIB)  # sparse: holes between
    return path


def test_a_clone_has_the_sources_bytes_allocated_in_full(tmp_path: Path) -> None:
    source = _source(tmp_path / "src.ext4")
    clone = VolumeClone(source, tmp_path / "clone.ext4")
    assert make_clones([clone]) in (["reflink"], ["copy"])
    assert clone.target.read_bytes() == source.read_bytes()
    assert os.stat(clone.target).st_blocks * 512 >= 4 * MIB  # no holes left to fill on the host later
    drop_clones([clone])
    drop_clones([clone])  # idempotent
    assert not clone.target.exists() and source.exists()


def test_a_failed_batch_leaves_no_clone(tmp_path: Path) -> None:
    source = _source(tmp_path / "src.ext4")
    made, missing = VolumeClone(source, tmp_path / "a.ext4"), VolumeClone(tmp_path / "gone.ext4", tmp_path / "b.ext4")
    with pytest.raises(FileNotFoundError):
        make_clones([made, missing])
    assert not made.target.exists() and not missing.target.exists()


def test_a_clone_never_lands_on_an_image_the_host_holds(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path / "volumes")
    assert store.new_path("vol-0123456789ab") == tmp_path / "volumes" / "vol-0123456789ab.ext4"
    store.path("vol-0123456789ab").write_bytes(b"tenant data")
    with pytest.raises(StateError, match="exists"):
        store.new_path("vol-0123456789ab")
