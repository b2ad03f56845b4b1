"""The guest kernel's whole module tree, for templates whose guests load modules themselves (``docker``: overlay,
bridge, veth, netfilter). The built-in images carry only the virtio modules of the initramfs
(:mod:`cryobox.image.kernel`); a template with ``TemplateSpec.kernel_modules`` gets ``/lib/modules/<release>``
of the same kernel package in its root filesystem, with ``modules.dep`` written by ``depmod`` so ``modprobe``
(and the kernel's own module requests, e.g. from ``iptables``) work in the guest."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageBuildError
from ..util.proc import Progress, Runner, run
from .cache import ContentCache
from .kernel import resolve_package_cached, unpacked_package


@dataclass(frozen=True)
class KernelModules:
    path: Path
    """The cache entry: ``lib/modules/<release>/`` below it."""

    @property
    def release(self) -> str:
        return next((self.path / "lib" / "modules").iterdir()).name

    @property
    def tree(self) -> Path:
        return self.path / "lib" / "modules" / self.release


def build_kernel_modules(cache: ContentCache, progress: Progress, runner: Runner = run) -> KernelModules:
    """The module tree of the guest kernel's package (the one :func:`~cryobox.image.kernel.build_kernel` boots)."""
    package = resolve_package_cached(cache.root / ".resolved-kernel.json", runner)
    inputs = {"package": package.name, "version": package.version, "sha256": package.sha256, "layout": 1}

    def build(out: Path) -> None:
        progress(f"kernel modules of {package.name} {package.version}")
        with unpacked_package(package, runner) as root:
            releases = sorted((root / "lib" / "modules").iterdir())
            if len(releases) != 1:
                raise ImageBuildError(f"expected one module tree in {package.name}, found {releases}")
            (out / "lib" / "modules").mkdir(parents=True)
            shutil.copytree(releases[0], out / "lib" / "modules" / releases[0].name, symlinks=True)

    path, _ = cache.get_or_build("kernel-modules", inputs, build)
    return KernelModules(path)


def install_modules(modules: KernelModules, root: Path, runner: Runner = run) -> None:
    """Copy the module tree into the image tree at ``root`` and index it (``depmod -b``: modules.dep, aliases)."""
    target = root / "lib" / "modules" / modules.release
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(modules.tree, target, symlinks=True, dirs_exist_ok=True)
    for link in ("build", "source"):  # point into a headers package the image does not have
        (target / link).unlink(missing_ok=True)
    runner(["depmod", "-b", str(root), modules.release])
