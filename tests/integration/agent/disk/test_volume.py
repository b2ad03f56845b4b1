"""The reflink volume for real (root): a sparse XFS image loop-mounted under an ext4 data dir."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.disk.volume import (
    _OCTAL_ESCAPE,
    allocated_bytes,
    clone_file,
    ensure_volume,
    is_mount_point,
    release_volume,
    supports_reflink,
)

MiB = 1 << 20


def fstype_at(path: Path) -> str | None:
    """The filesystem type mounted exactly at ``path``, from /proc/self/mountinfo."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), left.split(" ")[4])
        if point == os.path.realpath(path):
            return right.split(" ")[0]
    return None


def loop_devices_of(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(params=["data", "data dir"])  # a space shows up as \040 in mountinfo
def data_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A data dir whose volume is unmounted again however the test ends, leaving no loop device behind."""
    path = tmp_path / request.param
    try:
        yield path
    finally:
        release_volume(path)
        deadline = time.monotonic() + 5
        while loop_devices_of(path / "volume.xfs") and time.monotonic() < deadline:
            time.sleep(0.05)  # the autoclear detach can lag the umount slightly
        assert not is_mount_point(path / "vol")
        assert loop_devices_of(path / "volume.xfs") == ""


def test_volume_lifecycle(data_dir: Path) -> None:
    data_dir.mkdir()
    if supports_reflink(data_dir):
        pytest.skip("the test data dir already supports reflink: no image would be mounted")
    vol = ensure_volume(data_dir, size_gib=1)
    assert vol.root == data_dir / "vol" and vol.image == data_dir / "volume.xfs" and vol.reflink
    assert fstype_at(vol.root) == "xfs"
    assert loop_devices_of(vol.image) != ""
    dio = subprocess.run(["losetup", "-n", "-O", "DIO", "-j", str(vol.image)], capture_output=True, text=True)
    assert dio.stdout.split() == ["1"]  # the loop device reads and writes its image with direct I/O
    assert vol.image.stat().st_size == 1 << 30
    assert allocated_bytes(vol.image) < 200 * MiB  # sparse: only XFS metadata is allocated
    assert supports_reflink(vol.root)

    disk = vol.root / "disk.qcow2"
    data = os.urandom(4 * MiB)
    with open(disk, "wb") as fh:
        fh.truncate(256 * MiB)
        fh.seek(100 * MiB)
        fh.write(data)
    assert clone_file(disk, vol.root / "clone.qcow2") == "reflink"
    with open(vol.root / "clone.qcow2", "rb") as fh:
        fh.seek(100 * MiB)
        assert fh.read(4 * MiB) == data
    with open(disk, "r+b") as fh:  # copy-on-write: the clone keeps the old content
        fh.seek(100 * MiB)
        fh.write(b"changed")
    with open(vol.root / "clone.qcow2", "rb") as fh:
        fh.seek(100 * MiB)
        assert fh.read(4 * MiB) == data

    assert ensure_volume(data_dir, size_gib=1) == vol  # reuses the mount
    assert sum(1 for line in loop_devices_of(vol.image).splitlines() if line) == 1

    assert release_volume(data_dir) is True
    assert fstype_at(vol.root) is None
    assert not (vol.root / "clone.qcow2").exists()
    assert release_volume(data_dir) is False

    assert ensure_volume(data_dir, size_gib=1) == vol  # mounted again, not reformatted: the data is still there
    assert fstype_at(vol.root) == "xfs"
    with open(vol.root / "clone.qcow2", "rb") as fh:
        fh.seek(100 * MiB)
        assert fh.read(4 * MiB) == data
