"""Build (or find in the cache) everything a template's VM boots from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageBuildError
from ..util.proc import Progress, Runner, run
from ..util.progress import as_reporter
from .agentdisk import AgentDisk, build_agent_disk
from .cache import ContentCache
from .initramfs import Initramfs, build_initramfs
from .kernel import Kernel, build_kernel
from .modules import build_kernel_modules
from .rootfs import Rootfs, build_rootfs
from .specs import TemplateSpec


@dataclass(frozen=True)
class ImageSet:
    kernel: Kernel
    initramfs: Initramfs
    rootfs: Rootfs
    agent_disk: AgentDisk | None = None
    """The read-only disk the guest agent runs from (templates with ``TemplateSpec.agent_disk``)."""

    @property
    def identity(self) -> dict[str, str]:
        """Cache keys of every part: the image half of a template's generation."""
        return {
            "kernel": self.kernel.path.name,
            "initramfs": self.initramfs.path.name,
            "rootfs": self.rootfs.path.name,
            **({"agentdisk": self.agent_disk.path.name} if self.agent_disk is not None else {}),
        }


def with_agent_disk(
    images_dir: Path, images: ImageSet, spec: TemplateSpec, progress: Progress, runner: Runner = run
) -> ImageSet:
    """``images`` with the agent disk when ``spec`` asks for it (a custom template's base images lack it)."""
    if not spec.agent_disk or images.agent_disk is not None:
        return images
    return dataclasses.replace(images, agent_disk=build_agent_disk(ContentCache(images_dir), progress, runner))


def build_images(images_dir: Path, spec: TemplateSpec, progress: Progress, runner: Runner = run) -> ImageSet:
    """The images of a built-in spec, built on the host from its fixed package set.

    :raises ImageBuildError: ``spec`` adds packages to its base: those are installed in a build VM
        (:mod:`cryobox.agent.templates.buildvm`), never here.
    """
    if spec.added_packages or spec.added_pip:
        raise ImageBuildError(f"template {spec.name!r} adds packages: its image is built in a build VM")
    cache = ContentCache(images_dir)
    with as_reporter(progress).phase(f"images {spec.name}", total=3 + spec.agent_disk) as phase:
        kernel = build_kernel(cache, progress, runner)
        phase.advance()
        initramfs = build_initramfs(cache, kernel, progress)
        phase.advance()
        modules = build_kernel_modules(cache, progress, runner) if spec.kernel_modules else None
        rootfs = build_rootfs(cache, spec.packages, progress, runner, modules=modules, free_mib=spec.disk_free_mib)
        phase.advance()
        agent_disk = None
        if spec.agent_disk:
            agent_disk = build_agent_disk(cache, progress, runner)
            phase.advance()
    return ImageSet(kernel=kernel, initramfs=initramfs, rootfs=rootfs, agent_disk=agent_disk)
