"""Custom template images: what a tenant adds to a built-in is installed in a build VM, never on the host.

The host downloads the packages without running them (:mod:`cryobox.image.downloads`), copies the base's
tree with the guest agent into a new ext4 image (labelled ``cryobuild``, with the downloads inside) and boots
a throwaway VM from the base template's images with that image as a second disk. The VM runs jailed like any
other, without a NIC; inside it ``cryobox-build-install`` mounts the disk, installs the packages with the
target's own apt and pip in a chroot (maintainer scripts run there) and relabels the disk ``cryoroot``. The
host never mounts or reads what the VM wrote: the image becomes the template's root filesystem as it is.
Builds wait in a bounded queue (:class:`BuildQueue`, one per host).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ...errors import BuildQueueFull, ImageBuildError
from ...image.builder import ImageSet, build_images, with_agent_disk
from ...image.buildpolicy import BuildAllowlist, BuildLimits
from ...image.cache import ContentCache
from ...image.downloads import download_debs, download_wheels
from ...image.rootfs import Rootfs, build_tree, guest_inputs, make_ext4, mirror, stage
from ...image.specs import TemplateSpec
from ...util.encoding import b64
from ...util.proc import Progress, Runner, run
from ..disk.qcow2 import create_overlay
from ..guest.exec import run_exec
from ..vm import Accel, MachineConfig, MemoryBacking, MicroVM, VmPaths
from ..vm.jail import JailSettings, VmJail, one_off_uid

BUILD_LABEL = "cryobuild"
BUILD_DIR = "var/cache/cryobox-build"
INSTALL_TIMEOUT_S = 1800.0
BOOT_TIMEOUT_S = 180.0
BUILD_MEMORY_MIB = 1024


def install_script() -> bytes:
    return resources.files("cryobox.image").joinpath("files/cryobox-build-install").read_bytes()


class BuildQueue:
    """At most ``concurrency`` build VMs at once on a host, at most ``depth`` builds waiting for one."""

    def __init__(self, limits: BuildLimits | None = None) -> None:
        limits = limits or BuildLimits()
        self.concurrency = limits.concurrency
        self.depth = limits.depth
        self._running = asyncio.Semaphore(limits.concurrency)
        self._waiting = 0

    @classmethod
    def from_env(cls) -> BuildQueue:
        return cls(BuildLimits.from_env())

    @property
    def waiting(self) -> int:
        return self._waiting

    @contextlib.asynccontextmanager
    async def turn(self, progress: Progress) -> AsyncIterator[None]:
        """Wait for a build VM's turn. :raises BuildQueueFull: ``depth`` builds are waiting already."""
        if self._waiting >= self.depth:
            raise BuildQueueFull(f"{self._waiting} template builds are queued on this host; try again later")
        self._waiting += 1
        try:
            if self._running.locked():
                progress("queued: waiting for this host's build VM")
            await self._running.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._running.release()


@dataclass(frozen=True)
class BuildVmHost:
    """What a build VM needs of its host."""

    images_dir: Path
    run_dir: Path
    accel: Accel
    tsc_khz: int
    jail: JailSettings | None
    queue: BuildQueue
    allowlist: BuildAllowlist = field(default_factory=BuildAllowlist.from_env)

    def machine(self, images: ImageSet, *, nic: bool = False) -> MachineConfig:
        """A build VM's machine: ``images``' kernel and initramfs, :data:`BUILD_MEMORY_MIB`, one vCPU."""
        return MachineConfig(
            memory_mib=BUILD_MEMORY_MIB,
            cpus=1,
            accel=self.accel,
            kernel=images.kernel.vmlinuz,
            initrd=images.initramfs.image,
            tsc_khz=self.tsc_khz,
            norandmaps=self.accel.default_norandmaps,
            nic=nic,
        )


async def images_for(host: BuildVmHost, spec: TemplateSpec, progress: Progress, runner: Runner = run) -> ImageSet:
    """``spec``'s images: its base's (built on the host from a fixed package set), plus a root filesystem
    built in a build VM when it adds packages."""
    base = spec.base_spec()
    packages, pip = spec.added_packages, spec.added_pip
    host.allowlist.check(spec)
    images = await asyncio.to_thread(build_images, host.images_dir, base, progress, runner)
    images = await asyncio.to_thread(with_agent_disk, host.images_dir, images, spec, progress, runner)
    if not packages and not pip:
        return images
    cache = ContentCache(host.images_dir)
    tree = await asyncio.to_thread(build_tree, cache, base.packages, progress, runner)
    inputs = {
        "tree": tree.parent.name,
        "packages": sorted(packages),
        "pip": sorted(pip),
        **guest_inputs(),
        "layout": 1,
    }

    async def build(out: Path) -> None:
        image = out / "rootfs.ext4"
        await asyncio.to_thread(_prepare_image, tree, out, image, packages, pip, progress, runner)
        async with host.queue.turn(progress):
            await _install_in_vm(host, images, image, progress)
        image.chmod(0o444)

    path, _ = await cache.aget_or_build("rootfs-vm", inputs, build)
    return dataclasses.replace(images, rootfs=Rootfs(path))


def _prepare_image(
    tree: Path,
    out: Path,
    image: Path,
    packages: tuple[str, ...],
    pip: tuple[str, ...],
    progress: Progress,
    runner: Runner,
) -> None:
    """On the host: the base tree, the guest agent and the downloads in a new ext4 image; nothing runs."""
    staging = out / "staging"
    stage(tree, staging, runner)
    build = staging / BUILD_DIR
    debs = download_debs(tree, packages, build / "debs", mirror(), progress, runner) if packages else []
    if pip:
        download_wheels(pip, build / "wheels", progress, runner)
        download_wheels(("pip",), build / "bootstrap", progress, runner, deps=False)
        (build / "requirements.txt").write_text("".join(f"{r}\n" for r in pip))
    downloaded = sum(p.stat().st_size for p in build.rglob("*") if p.is_file())
    progress(f"{len(debs)} packages, {downloaded >> 20} MiB downloaded; writing the build disk")
    size_mib = make_ext4(staging, image, BUILD_LABEL, runner, extra_bytes=downloaded * 4)
    shutil.rmtree(staging)
    progress(f"build disk ready ({size_mib} MiB ext4, sparse)")


async def _install_in_vm(host: BuildVmHost, images: ImageSet, image: Path, progress: Progress) -> None:
    name = f"build-{image.parent.name[-24:]}"
    paths = VmPaths(host.run_dir / name)
    shutil.rmtree(paths.root, ignore_errors=True)
    paths.root.mkdir(parents=True)
    machine = host.machine(images)
    with one_off_uid(host.jail, host.run_dir) as uid:
        jail = VmJail(host.jail, uid) if host.jail is not None and uid is not None else None
        await _run_install(name, machine, paths, images, image, jail, progress)
    os.chown(image, os.getuid(), os.getgid())  # the build VM's uid owned it while it ran
    with open(image, "rb+") as fh:
        os.fsync(fh.fileno())


async def _run_install(
    name: str,
    machine: MachineConfig,
    paths: VmPaths,
    images: ImageSet,
    image: Path,
    jail: VmJail | None,
    progress: Progress,
) -> None:
    vm: MicroVM | None = None
    try:
        disk = paths.root / "disk.qcow2"
        create_overlay(disk, images.rootfs.image)
        memory = paths.root / "memory"
        with open(memory, "wb") as fh:
            fh.truncate(BUILD_MEMORY_MIB << 20)
        vm = MicroVM(name, machine, paths, MemoryBacking(memory, share=True), disk, None, jail, data_disks=(image,))
        progress("build VM: booting the base template's image")
        started = time.monotonic()
        await vm.start(incoming=False)
        await vm.wait_guest_ready(BOOT_TIMEOUT_S)
        progress(f"build VM: up after {time.monotonic() - started:.1f}s; installing")
        guest = await vm.connect_guest()
        await guest.call("write_file", {"path": "/run/cryobox-build-install", "content": b64(install_script())})
        result = await run_exec(guest, "sh /run/cryobox-build-install", timeout_s=INSTALL_TIMEOUT_S)
        for line in result.stdout.splitlines()[-20:]:
            progress(f"build VM: {line}")
        if result.exit_code != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise ImageBuildError(f"installing the template's packages failed ({result.exit_code}):\n{tail}")
    finally:
        if vm is not None:
            await vm.kill()
        shutil.rmtree(paths.root, ignore_errors=True)
