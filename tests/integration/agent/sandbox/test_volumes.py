"""Volumes joining restored sandboxes on a real host agent (in process, ``base`` template, jailed QEMU): the baked
empty slots are pointed at ext4 images before the guest runs and mounted by the guest agent; a create without
volumes leaves every slot empty; read-only volumes refuse writes in the guest; a write the guest fsynced is in
the image after a SIGKILL of QEMU; an image attached read-write is refused to a second sandbox; a delete leaves
the image clean. Images are read on the host with e2fsprogs only (never mounted in the host kernel)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cryobox.agent.guest.exec import ExecResult, ExecSpec, run_exec
from cryobox.agent.host.startup import Host, HostConfig, start_host
from cryobox.agent.sandbox.pool import PoolMode
from cryobox.agent.sandbox.sandbox import Sandbox
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm.slots import volume_slots
from cryobox.agent.vm.volumes import VolumeAttach
from cryobox.bench.volume import make_ext4
from cryobox.config import Paths
from cryobox.errors import StateError
from cryobox.image.specs import BASE
from tests.support.teardown import reclaim_data_dir

MIB = 1 << 20
# the same bytes to two files, only one of them fsynced (the other stays in the guest's page cache: the control)
WRITES = (
    "import os\n"
    "for name, sync in (('unsynced', False), ('durable', True)):\n"
    "    fd = os.open('/mnt/data/' + name, os.O_WRONLY | os.O_CREAT, 0o644)\n"
    "    os.write(fd, b'written before the kill')\n"
    "    os.fsync(fd) if sync else None\n"
)


@contextlib.asynccontextmanager
async def host_agent(tmp_path: Path, cache_dir: Path, prespawn: int, mode: PoolMode) -> AsyncIterator[Host]:
    paths = Paths(data_dir=tmp_path / "data", cache_dir=cache_dir)
    config = HostConfig(paths=paths, prespawn=prespawn, pool_mode=mode, net_pool=3, templates=(BASE,))
    host: Host | None = None
    try:
        host = await start_host(config, print)
        yield host
    finally:
        if host is not None:
            await host.close()
        await asyncio.to_thread(reclaim_data_dir, paths.data_dir, cache_dir)


async def _pool_ready(host: Host, want: int = 1) -> None:
    deadline = time.monotonic() + 180
    while host.service.pools[BASE.name].ready_count < want:
        assert time.monotonic() < deadline, "the pool never filled"
        await asyncio.sleep(0.1)


async def _sh(sandbox: Sandbox, cmd: str) -> ExecResult:
    return await run_exec(await sandbox.vm.connect_guest(), ExecSpec(cmd, user="root", timeout_s=120))


async def _out(sandbox: Sandbox, cmd: str) -> str:
    result = await _sh(sandbox, cmd)
    assert result.exit_code == 0, (cmd, result.stdout, result.stderr)
    return result.stdout


def _e2(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _read_back(image: Path, name: str, scratch: Path) -> str:
    """``name`` from a copy of ``image``, its journal replayed by e2fsck (userspace: the host never mounts it)."""
    copy = scratch / f"copy-{image.name}"
    shutil.copyfile(image, copy)
    assert _e2("e2fsck", "-fy", str(copy)).returncode in (0, 1)  # 1: it replayed the journal
    return _e2("debugfs", "-R", f"cat /{name}", str(copy)).stdout


async def _sigkill(sandbox: Sandbox) -> None:
    pid = sandbox.vm.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while sandbox.vm.alive():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_volumes_join_warm_pool_sandboxes(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    content = tmp_path / "content"
    content.mkdir()
    (content / "hello.txt").write_text("shared reference data\n")
    volumes = tmp_path / "data" / "vol" / "volumes"
    async with host_agent(tmp_path, cache_dir, prespawn=1, mode=PoolMode.WARM) as host:
        service = host.service
        data = make_ext4(volumes / "data.ext4", 64 * MIB, "fcvol-data")
        ref = make_ext4(volumes / "ref.ext4", 16 * MIB, "fcvol-ref", content)

        # no volume: every slot is empty, nothing is mounted, the pool's warm-up left no trace
        await _pool_ready(host)
        plain = await service.create(BASE.name)
        assert plain.volumes == ()
        sizes = await _out(plain, "for d in /sys/block/vd*; do echo $(cat $d/serial) $(cat $d/size); done")
        slots = [line.split() for line in sizes.splitlines() if line.startswith("cbx-")]
        assert sorted(s for s, _ in slots) == sorted(s.serial for s in volume_slots(4, 4))
        assert {size for _, size in slots} == {"0"}
        assert await _out(plain, "grep -c ' /.cryobox-volume-warmup\\| /mnt' /proc/mounts || true") == "0\n"
        assert await _out(plain, "ls -a / | grep -c cryobox-volume-warmup || true") == "0\n"
        blocks = await plain.vm.execute("query-block")  # a device with an id is named by it
        inserted = {b["qdev"]: b["inserted"]["node-name"] for b in blocks if b.get("qdev", "").startswith("vol-")}
        assert inserted == {s.id: s.empty_node for s in volume_slots(4, 4)}, blocks
        await service.delete(plain.id)

        # a read-write and a read-only volume
        await _pool_ready(host)
        wanted = [
            VolumeAttach(data, mount_path="/mnt/data", name="data"),
            VolumeAttach(ref, read_only=True, mount_path="/mnt/ref", name="ref"),
        ]
        sandbox = await service.create(BASE.name, volumes=wanted)
        rw, ro = sandbox.volumes
        for volume in (rw, ro):  # the host's device names are the guest's
            assert (await _out(sandbox, f"cat /sys/block/{volume.device[5:]}/serial")).strip() == volume.serial
        mounts = await _out(sandbox, "grep ' /mnt/' /proc/mounts")
        assert f"{rw.device} /mnt/data ext4 rw,nosuid,nodev" in mounts
        assert f"{ro.device} /mnt/ref ext4 ro,nosuid,nodev" in mounts
        assert await _out(sandbox, "cat /mnt/ref/hello.txt") == "shared reference data\n"
        for refused in (
            "echo x > /mnt/ref/new",
            "mount -o remount,rw /mnt/ref",
            f"blockdev --setrw {ro.device}; dd if=/dev/zero of={ro.device} bs=4k count=1 oflag=direct",
        ):
            assert (await _sh(sandbox, refused)).exit_code != 0, refused
        assert await _out(sandbox, "echo kept > /mnt/data/kept && sync && cat /mnt/data/kept") == "kept\n"

        # one writer: the image another sandbox holds read-write is refused, and nothing of the attempt stays
        held = len(service.sandboxes)
        with pytest.raises(StateError, match="attached to another sandbox"):
            await service.create(BASE.name, volumes=[VolumeAttach(data, mount_path="/mnt/data", name="data")])
        assert len(service.sandboxes) == held
        assert await _out(sandbox, "cat /mnt/data/kept") == "kept\n"

        # a delete freezes the filesystem before the kill: the image is clean, no journal to replay
        await service.delete(sandbox.id)
        check = _e2("e2fsck", "-fn", str(data))
        assert check.returncode == 0, check.stdout + check.stderr
        assert "needs_recovery" not in _e2("dumpe2fs", "-h", str(data)).stdout
        assert _e2("debugfs", "-R", "cat /kept", str(data)).stdout == "kept\n"
        assert _e2("e2fsck", "-fn", str(ref)).returncode == 0  # never written


async def test_fsynced_writes_survive_a_sigkill_and_a_woken_sandbox_keeps_its_volume(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    """Without a pool every create spawns a QEMU and attaches while its state is loaded (before ``cont``); a wake
    re-attaches the same way."""
    volumes = tmp_path / "data" / "vol" / "volumes"
    async with host_agent(tmp_path, cache_dir, prespawn=0, mode=PoolMode.SPAWNED) as host:
        service = host.service
        data = make_ext4(volumes / "data.ext4", 32 * MIB, "fcvol-data")
        first = await service.create(BASE.name, volumes=[VolumeAttach(data, mount_path="/mnt/data", name="data")])
        spec = ExecSpec("python3 -", stdin=WRITES.encode(), user="root")
        written = await run_exec(await first.vm.connect_guest(), spec)
        assert written.exit_code == 0, written.stderr
        await _sigkill(first)  # right after the guest's fsync returned: no settle, no unmount
        assert _read_back(data, "durable", tmp_path) == "written before the kill"
        assert _read_back(data, "unsynced", tmp_path) == ""  # what was not fsynced died with QEMU
        await service.delete(first.id)
        assert data.exists()  # a kill detaches; the volume stays

        # the lock died with QEMU: the volume joins the next sandbox, its data there
        second = await service.create(BASE.name, volumes=[VolumeAttach(data, mount_path="/srv/v", name="data")])
        assert await _out(second, "cat /srv/v/durable") == "written before the kill"

        # hibernated and woken: the same slot points at the image again, the guest's mount carries on
        await _out(second, "echo before > /srv/v/hibernated && sync")
        await service.hibernate(second.id)
        await service.resume(second.id)
        assert await _out(second, "cat /srv/v/hibernated && echo after > /srv/v/woken && sync && cat /srv/v/woken") == (
            "before\nafter\n"
        )
        await service.delete(second.id)
        assert _e2("e2fsck", "-fn", str(data)).returncode == 0
        assert _e2("debugfs", "-R", "cat /woken", str(data)).stdout == "after\n"
