"""The build VM restored, not booted: a snapshot of cryobox's own Debian, booted once per host and baked with
placeholder disks where the image being built (``vdb``) and the inputs (``vdc``) go.

Like every sandbox, a build VM is then a restore (``-incoming defer``, the snapshot's RAM mapped privately, its
device state loaded) of the same device list, with the real target and inputs files behind the two data disks:
they have the placeholders' sizes (:data:`TARGET_BYTES`, :data:`INPUTS_BYTES`), so the guest's idea of its disks
holds, and the driver drops the block devices' page cache (``blockdev --flushbufs``) before it mounts them. The
guest then rejoins the world (clock, entropy, identity: the agent's ``resume`` op). This takes a cold boot (5.8 s
under TCG) off every build; a build whose inputs do not fit :data:`INPUTS_BYTES` boots cold as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from ...image.builder import ImageSet
from ...image.cache import ContentCache
from ...util.encoding import b64
from ...util.files import stable_hash
from ..disk.qcow2 import create_overlay
from ..guest.client import GuestClient
from ..snapshot.layout import ImageFiles
from ..vm import MachineConfig, MemoryBacking, MicroVM, NetAttach, VmPaths
from ..vm.jail import JailSettings, VmJail, one_off_uid
from .bake import qemu_version
from .buildvm import BOOT_TIMEOUT_S

TARGET_BYTES = 8 << 30
INPUTS_BYTES = 16 << 30
FORMAT = 2
RESUME_TIMEOUT_S = 30.0

BakeNet = Callable[[], AbstractAsyncContextManager[NetAttach]]


@dataclass(frozen=True)
class Builder(ImageFiles):
    """A baked build VM: its RAM, device state and OS disk overlay (``disk.qcow2``), like any restorable image."""

    path: Path


async def ensure_builder(
    images_dir: Path,
    os_images: ImageSet,
    machine: MachineConfig,
    run_dir: Path,
    jail: JailSettings | None,
    bake_net: BakeNet,
    progress: Callable[[str], None],
) -> Builder:
    """The host's baked build VM for these images and machine (baked once, content-cached)."""
    inputs = {
        "format": FORMAT,
        "images": os_images.identity,
        "machine": machine.identity(),
        "qemu": qemu_version(),
        "disks": [TARGET_BYTES, INPUTS_BYTES],
    }

    async def bake(out: Path) -> None:
        await _bake(out, os_images, machine, run_dir, jail, bake_net, progress)

    path, _ = await ContentCache(images_dir).aget_or_build("builder", inputs, bake)
    return Builder(path)


async def _bake(
    out: Path,
    os_images: ImageSet,
    machine: MachineConfig,
    run_dir: Path,
    jail_settings: JailSettings | None,
    bake_net: BakeNet,
    progress: Callable[[str], None],
) -> None:
    paths = VmPaths(run_dir / f"builder-{stable_hash(str(out))[:12]}")
    shutil.rmtree(paths.root, ignore_errors=True)
    paths.root.mkdir(parents=True)
    vm: MicroVM | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            os_disk = out / "disk.qcow2"
            create_overlay(os_disk, os_images.rootfs.image)
            memory = out / "memory"
            with open(memory, "wb") as fh:
                fh.truncate(machine.memory_mib << 20)
            target = paths.root / "target.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(target), str(TARGET_BYTES)], check=True)
            inputs = paths.root / "inputs.raw"
            with open(inputs, "wb") as fh:
                fh.truncate(INPUTS_BYTES)
            net = await stack.enter_async_context(bake_net())
            uid = stack.enter_context(one_off_uid(jail_settings, run_dir))
            jail = VmJail(jail_settings, uid) if jail_settings is not None and uid is not None else None
            vm = MicroVM(
                "builder", machine, paths, MemoryBacking(memory, share=True), os_disk, net, jail, (target, inputs)
            )
            progress("baking the build VM (once per host): cold boot")
            started = time.monotonic()
            await vm.start(incoming=False)
            await vm.wait_guest_ready(BOOT_TIMEOUT_S)
            guest = await vm.connect_guest()
            await guest.call("sync", {}, timeout=60)
            await vm.save_state(out / "vmstate")
            await vm.kill()
            vm = None
            for name in ("memory", "vmstate", "disk.qcow2"):
                with open(out / name, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.chown(out / name, os.getuid(), os.getgid())
                (out / name).chmod(0o444)
            progress(f"build VM baked in {time.monotonic() - started:.1f}s")
    finally:
        if vm is not None:
            await vm.kill()
        shutil.rmtree(paths.root, ignore_errors=True)


async def restore_builder(
    builder: Builder,
    name: str,
    machine: MachineConfig,
    paths: VmPaths,
    target: Path,
    inputs: Path,
    net: NetAttach | None,
    jail: VmJail | None,
) -> tuple[MicroVM, GuestClient]:
    """A build VM restored from ``builder`` with ``target`` and ``inputs`` behind its data disks, rejoined."""
    disk = paths.root / "os.qcow2"
    create_overlay(disk, builder.disk)
    vm = MicroVM(name, machine, paths, MemoryBacking(builder.memory, share=False), disk, net, jail, (target, inputs))
    try:
        await vm.start(incoming=True)
        await vm.connect_guest()
        await vm.restore(builder.vmstate)
        guest = await vm.connect_guest()
        await guest.call(
            "resume",
            {"epoch_ns": time.time_ns(), "entropy": b64(os.urandom(64)), "instance_id": name, "run_hooks": False},
            timeout=RESUME_TIMEOUT_S,
        )
        return vm, guest
    except BaseException:
        await vm.kill()
        raise


__all__ = ["INPUTS_BYTES", "TARGET_BYTES", "Builder", "ensure_builder", "restore_builder"]
