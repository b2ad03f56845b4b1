"""Guest root filesystem: a debootstrap minbase tree (cached per package set) turned into a read-only ext4
base image that also carries the guest agent and init. Only the last step reruns when the agent changes."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..util.files import tree_hash
from ..util.proc import Progress, Runner, run
from .cache import ContentCache
from .modules import KernelModules, install_modules
from .specs import DEBIAN_SUITE

GUEST_PACKAGE_DIR = Path(__file__).resolve().parent.parent / "guest"
GUEST_SITE = "usr/lib/python3/dist-packages/cryobox_guest"
ROOT_LABEL = "cryoroot"


def mirror() -> str:
    return os.environ.get("CRYOBOX_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class Rootfs:
    path: Path

    @property
    def image(self) -> Path:
        return self.path / "rootfs.ext4"


def build_tree(cache: ContentCache, packages: tuple[str, ...], progress: Progress, runner: Runner = run) -> Path:
    """A debootstrap tree of a built-in template's package set (fixed in code by the operator, never by a
    tenant: a custom template's extra packages are installed in a build VM, :mod:`cryobox.agent.templates.buildvm`)."""
    inputs: dict[str, object] = {"suite": DEBIAN_SUITE, "variant": "minbase", "packages": sorted(packages), "layout": 1}

    def build(out: Path) -> None:
        progress(f"debootstrap {DEBIAN_SUITE} minbase + {', '.join(packages)} (a few minutes, once)")
        tree = out / "tree"
        runner(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", DEBIAN_SUITE, str(tree), mirror()],
            progress=lambda line: progress(f"debootstrap: {line}"),
        )
        # Trim what a sandbox never needs: package lists and caches.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for child in (tree / junk).glob("*"):
                if child.is_file():
                    child.unlink()

    path, _ = cache.get_or_build("debootstrap", inputs, build)
    return path / "tree"


def init_script() -> bytes:
    return resources.files("cryobox.image").joinpath("files/cryobox-init").read_bytes()


SANDBOX_USER = ("user", 1000, "/home/user")
"""The unprivileged account every image has (E2B's default user: its SDK's commands and files run as ``user``
with ``/home/user`` as home unless told otherwise). cryobox's own API runs commands as root."""


def guest_inputs() -> dict[str, object]:
    """What of the guest side an image carries (a change rebuilds only the image, not the tree)."""
    return {
        "agent": tree_hash(GUEST_PACKAGE_DIR),
        "init": init_script().hex()[:64],
        "init_len": len(init_script()),
        "user": list(SANDBOX_USER),
    }


def add_user(root: Path, name: str, uid: int, home: str) -> None:
    """Add ``name`` (uid = gid = ``uid``, bash, no password) to the tree at ``root`` with its home; idempotent."""
    etc = root / "etc"
    if not (etc / "passwd").exists():  # not a system tree (a test's stand-in): nothing to add to
        return
    passwd = (etc / "passwd").read_text()
    if any(line.split(":", 1)[0] == name for line in passwd.splitlines()):
        return
    shell = "/bin/bash" if (root / "bin" / "bash").exists() or (root / "usr" / "bin" / "bash").exists() else "/bin/sh"
    (etc / "passwd").write_text(passwd + f"{name}:x:{uid}:{uid}::{home}:{shell}\n")
    group = etc / "group"
    group.write_text(group.read_text() + f"{name}:x:{uid}:\n")
    shadow = etc / "shadow"
    if shadow.exists():
        mode = shadow.stat().st_mode
        shadow.write_text(shadow.read_text() + f"{name}:!:19000:0:99999:7:::\n")
        shadow.chmod(mode & 0o7777)
    home_dir = root / home.lstrip("/")
    home_dir.mkdir(parents=True, exist_ok=True)
    home_dir.chmod(0o755)
    os.chown(home_dir, uid, uid)


def stage(tree: Path, staging: Path, runner: Runner = run) -> None:
    """Copy ``tree`` to ``staging`` and add the guest agent, the init and the hostname."""
    runner(["cp", "-a", "--reflink=auto", str(tree), str(staging)])
    site = staging / GUEST_SITE
    shutil.copytree(GUEST_PACKAGE_DIR, site, ignore=shutil.ignore_patterns("__pycache__"))
    init = staging / "sbin" / "cryobox-init"
    init.write_bytes(init_script())
    init.chmod(0o755)
    (staging / "etc" / "hostname").write_text("sandbox\n")
    add_user(staging, *SANDBOX_USER)


def make_ext4(
    staging: Path,
    image: Path,
    label: str,
    runner: Runner = run,
    extra_bytes: int = 0,
    size_mib: int | None = None,
) -> int:
    """Write ``staging`` into a new sparse ext4 ``image`` with room to spare (or exactly ``size_mib`` MiB long);
    returns its size in MiB."""
    if size_mib is None:
        used = sum(p.lstat().st_size for p in staging.rglob("*") if p.is_file() and not p.is_symlink())
        size_mib = int(used * 1.25 + extra_bytes) // (1 << 20) + 1024
    runner(["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(staging), str(image), f"{size_mib}M"])
    return size_mib


def build_rootfs(
    cache: ContentCache,
    packages: tuple[str, ...],
    progress: Progress,
    runner: Runner = run,
    *,
    modules: KernelModules | None = None,
    free_mib: int = 0,
) -> Rootfs:
    """The read-only root image of a built-in package set; with ``modules`` the kernel's module tree in it, with
    ``free_mib`` that much more free space than the default (room for what the sandbox writes, e.g. images)."""
    tree = build_tree(cache, packages, progress, runner)
    inputs: dict[str, object] = {"tree": tree.parent.name, **guest_inputs(), "layout": 1}
    if modules is not None:
        inputs["modules"] = modules.path.name
    if free_mib:
        inputs["free_mib"] = free_mib

    def build(out: Path) -> None:
        progress("assembling root filesystem image")
        staging = out / "staging"
        stage(tree, staging, runner)
        if modules is not None:
            install_modules(modules, staging, runner)
        image = out / "rootfs.ext4"
        size_mib = make_ext4(staging, image, ROOT_LABEL, runner, extra_bytes=free_mib << 20)
        shutil.rmtree(staging)
        image.chmod(0o444)
        progress(f"root filesystem ready ({size_mib} MiB ext4, sparse)")

    path, _ = cache.get_or_build("rootfs", inputs, build)
    return Rootfs(path)
