"""Build (or find in the cache) everything a template's VM boots from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageBuildError
from ..util.proc import Progress, Runner, run
from ..util.progress import as_reporter
from .cache import ContentCache
from .initramfs import Initramfs, build_initramfs
from .kernel import Kernel, build_kernel
from .rootfs import Rootfs, build_rootfs
from .specs import TemplateSpec


@dataclass(frozen=True)
class ImageSet:
    kernel: Kernel
    initramfs: Initramfs
    rootfs: Rootfs

    @property
    def identity(self) -> dict[str, str]:
        """Cache keys of every part: the image half of a template's generation."""
        return {
            "kernel": self.kernel.path.name,
            "initramfs": self.initramfs.path.name,
            "rootfs": self.rootfs.path.name,
        }


def build_images(images_dir: Path, spec: TemplateSpec, progress: Progress, runner: Runner = run) -> ImageSet:
    """The images of a built-in spec, built on the host from its fixed package set.

    :raises ImageBuildError: ``spec`` adds packages to its base: those are installed in a build VM
        (:mod:`cryobox.agent.templates.buildvm`), never here.
    """
    if spec.added_packages or spec.added_pip:
        raise ImageBuildError(f"template {spec.name!r} adds packages: its image is built in a build VM")
    cache = ContentCache(images_dir)
    with as_reporter(progress).phase(f"images {spec.name}", total=3) as phase:
        kernel = build_kernel(cache, progress, runner)
        phase.advance()
        initramfs = build_initramfs(cache, kernel, progress)
        phase.advance()
        rootfs = build_rootfs(cache, spec.packages, progress, runner)
        phase.advance()
    return ImageSet(kernel=kernel, initramfs=initramfs, rootfs=rootfs)
