"""A pool VM's volume warm-up: the image made once, a private sparse copy of it per VM, and the warm step's
sequence on a fake VM (attach to the last read-write slot, mount in the guest's resume, unmount, remove the mount
point, detach to capacity 0), which leaves the VM paused with every slot empty."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from cryobox.agent.sandbox.poolwarm import warm_volumes
from cryobox.agent.vm import VmState
from cryobox.agent.vm.volumes import DOORBELL
from cryobox.agent.vm.volumewarm import IMAGE_NAME, WARMUP_BYTES, WARMUP_MOUNT, WarmupData, ensure_image, private_copy
from tests.support.fake_vm import MACHINE, FakeVm

needs_mkfs = pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="no mkfs.ext4 on this host")


@needs_mkfs
def test_the_image_is_made_once_and_copied_sparsely(tmp_path: Path) -> None:
    image = ensure_image(tmp_path)
    assert image == tmp_path / IMAGE_NAME and image.stat().st_size == WARMUP_BYTES
    made = image.stat().st_mtime_ns
    assert ensure_image(tmp_path) == image and image.stat().st_mtime_ns == made
    assert [p.name for p in tmp_path.iterdir()] == [IMAGE_NAME]  # no temporary file left
    data = WarmupData.read(image)
    assert sum(len(chunk) for _, chunk in data.chunks) < WARMUP_BYTES // 8  # what mkfs wrote is kept, not zeros
    fd = private_copy(data)
    try:
        assert os.fstat(fd).st_size == WARMUP_BYTES
        assert os.pread(fd, WARMUP_BYTES, 0) == image.read_bytes()
        assert os.fstat(fd).st_blocks * 512 < WARMUP_BYTES  # only what mkfs wrote takes memory
    finally:
        os.close(fd)


async def test_the_warm_step_mounts_unmounts_and_empties_the_slot(tmp_path: Path) -> None:
    image = tmp_path / "warm.ext4"
    with open(image, "wb") as fh:
        fh.truncate(1 << 20)
    machine = dataclasses.replace(MACHINE, rw_volume_slots=2, ro_volume_slots=1)
    vm = FakeVm("vm-1", machine, tmp_path, VmState.RUNNING, "")
    await warm_volumes(vm, image, WarmupData.read(image))
    assert vm.state is VmState.PAUSED and vm.volumes == ()
    ops = [op for op, _ in vm.fake_guest.calls]
    assert ops == ["resume", "set_clock", "volumes_settle", "delete"]
    resume = vm.fake_guest.calls[0][1]
    assert resume["run_hooks"] is False and [v["path"] for v in resume["volumes"]] == [WARMUP_MOUNT]
    assert vm.fake_guest.calls[2][1] == {"paths": [WARMUP_MOUNT], "mode": "unmount"}
    assert vm.qmp_log[-4:] == [
        ("qom-set", {"path": "/machine/peripheral/vol-rw1", "property": "drive", "value": DOORBELL}),
        ("block_resize", {"node-name": DOORBELL, "size": 0}),
        ("qom-set", {"path": "/machine/peripheral/vol-rw1", "property": "drive", "value": "vol-rw1-empty"}),
        ("blockdev-del", {"node-name": "vol-rw1-volume"}),
    ]
