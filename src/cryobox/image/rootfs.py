"""Guest root filesystem: a debootstrap minbase tree (cached per package set) turned into a read-only ext4
base image that also carries the guest agent and init. Only the last step reruns when the agent changes."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..util.files import tree_hash
from ..util.proc import Progress, Runner, run
from .cache import ContentCache
from .specs import DEBIAN_SUITE

GUEST_PACKAGE_DIR = Path(__file__).resolve().parent.parent / "guest"
GUEST_SITE = "usr/lib/python3/dist-packages/cryobox_guest"


def mirror() -> str:
    return os.environ.get("CRYOBOX_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class Rootfs:
    path: Path

    @property
    def image(self) -> Path:
        return self.path / "rootfs.ext4"


def build_tree(
    cache: ContentCache, packages: tuple[str, ...], progress: Progress, runner: Runner = run, pip: tuple[str, ...] = ()
) -> Path:
    inputs: dict[str, object] = {"suite": DEBIAN_SUITE, "variant": "minbase", "packages": sorted(packages), "layout": 1}
    if pip:
        inputs["pip"] = sorted(pip)

    def build(out: Path) -> None:
        progress(f"debootstrap {DEBIAN_SUITE} minbase + {', '.join(packages)} (a few minutes, once)")
        tree = out / "tree"
        runner(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", DEBIAN_SUITE, str(tree), mirror()],
            progress=lambda line: progress(f"debootstrap: {line}"),
        )
        if pip:
            pip_install(tree, pip, progress, runner)
        # Trim what a sandbox never needs: package lists and caches.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for child in (tree / junk).glob("*"):
                if child.is_file():
                    child.unlink()

    path, _ = cache.get_or_build("debootstrap", inputs, build)
    return path / "tree"


# Wheels that run on Debian 12 (glibc 2.36, CPython 3.11, x86_64): pure-Python and manylinux wheels.
WHEEL_PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def pip_install(tree: Path, requirements: tuple[str, ...], progress: Progress, runner: Runner = run) -> None:
    """Install pip packages into the tree at build time (guests have no network).

    The host downloads the wheels with its own pip and settings (proxy, CA bundle: this machine reaches PyPI
    through a TLS-intercepting proxy whose CA only the host trusts), then the tree's pip installs them offline.
    Packages that publish no wheel for the guest's platform are refused with pip's message.
    """
    progress(f"pip install {' '.join(requirements)}")
    wheels = tree / "tmp" / "cryobox-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)]
    try:
        runner(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                *platforms,
                "--dest",
                str(wheels),
                *requirements,
            ],
            progress=lambda line: progress(f"pip download: {line}"),
        )
        runner(
            [
                "chroot",
                str(tree),
                "python3",
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                "--break-system-packages",
                "--no-index",
                "--find-links",
                "/tmp/cryobox-wheels",
                *requirements,
            ],
            progress=lambda line: progress(f"pip: {line}"),
        )
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


def init_script() -> bytes:
    return resources.files("cryobox.image").joinpath("files/cryobox-init").read_bytes()


def build_rootfs(
    cache: ContentCache, packages: tuple[str, ...], progress: Progress, runner: Runner = run, pip: tuple[str, ...] = ()
) -> Rootfs:
    tree = build_tree(cache, packages, progress, runner, pip)
    inputs = {
        "tree": tree.parent.name,
        "agent": tree_hash(GUEST_PACKAGE_DIR),
        "init": init_script().hex()[:64],
        "init_len": len(init_script()),
        "layout": 1,
    }

    def build(out: Path) -> None:
        progress("assembling root filesystem image")
        staging = out / "staging"
        runner(["cp", "-a", "--reflink=auto", str(tree), str(staging)])
        site = staging / GUEST_SITE
        shutil.copytree(GUEST_PACKAGE_DIR, site, ignore=shutil.ignore_patterns("__pycache__"))
        init = staging / "sbin" / "cryobox-init"
        init.write_bytes(init_script())
        init.chmod(0o755)
        (staging / "etc" / "hostname").write_text("sandbox\n")
        used = sum(p.lstat().st_size for p in staging.rglob("*") if p.is_file() and not p.is_symlink())
        size_mib = int(used * 1.25) // (1 << 20) + 1024
        image = out / "rootfs.ext4"
        runner(["mkfs.ext4", "-q", "-F", "-L", "cryoroot", "-d", str(staging), str(image), f"{size_mib}M"])
        shutil.rmtree(staging)
        image.chmod(0o444)
        progress(f"root filesystem ready ({size_mib} MiB ext4, sparse)")

    path, _ = cache.get_or_build("rootfs", inputs, build)
    return Rootfs(path)
