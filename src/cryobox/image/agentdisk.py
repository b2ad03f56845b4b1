"""The agent disk: a read-only ext4 carrying everything the guest agent runs on, so any image boots.

A template that opts in (``TemplateSpec.agent_disk``) gets this disk as its second virtio disk; the initramfs
mounts it read-only at ``/.cryobox`` inside the image's root and switch_roots to ``/.cryobox/init``, which runs
the guest agent from the disk alone: nothing of the image's userland (no shell, no libc, no Python) is used.
Layout (every path relative, no symlink leaves the disk)::

    init                          busybox-sh PID 1 (files/agentdisk-init)
    bin/busybox, bin/<applet>     Debian's static busybox and its applet links
    lib/<soname>                  the shared libraries python3.11 and its stdlib extension modules need, with
                                  ld-linux-x86-64.so.2 (the agent runs as ``lib/ld-linux-x86-64.so.2
                                  --inhibit-cache --library-path /.cryobox/lib python/bin/python3.11 -I -S``:
                                  nothing in the environment, so the agent's children inherit none of it)
    python/bin/python3.11         from the Debian tree the root filesystems are built from
    python/lib/python3.11/        its stdlib (sys.prefix is found from the executable's place) with the guest
                                  agent package ``cryobox_guest`` in it
    manifest.json                 what was put in and what was left out

Cached like every image (kind ``agentdisk``): a change of the tree, busybox, the agent or the init rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ImageBuildError
from ..util.files import tree_hash
from ..util.proc import Progress, Runner, run
from .cache import ContentCache
from .elfdeps import find_library, in_tree, resolve_closure
from .initramfs import BUSYBOX
from .rootfs import GUEST_PACKAGE_DIR, build_tree
from .specs import BASE_PACKAGES

AGENT_MOUNT = "/.cryobox"
"""Where the guest sees the agent disk (also in files/agentdisk-init and the guest's :mod:`runtime`)."""
AGENT_LABEL = "cryoagent"
AGENT_DEVICE = "/dev/vdb"
"""The agent disk is the second virtio disk, right after the root disk (``agent/vm/machine.py``)."""
PYTHON = "python3.11"
LOADER = "ld-linux-x86-64.so.2"
STDLIB_DROP = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "distutils",
        "dist-packages",  # what a tree installed besides the stdlib (not the agent's)
        "site-packages",
        "sitecustomize.py",  # Debian's is a link to /etc/python3.11 (the image's /etc)
        "EXTERNALLY-MANAGED",
    }
)
"""Stdlib entries the agent never needs (tests, GUIs, installers) or that would reach into the image."""
EXTENSION_DROP_PREFIXES = ("_test", "xxlimited", "_xxtestfuzz", "_tkinter", "_ctypes_test")


@dataclass(frozen=True)
class AgentDisk:
    path: Path

    @property
    def image(self) -> Path:
        return self.path / "agent.ext4"

    @property
    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.path / "manifest.json").read_text())
        return data


def init_script() -> bytes:
    return resources.files("cryobox.image").joinpath("files/agentdisk-init").read_bytes()


def build_agent_disk(cache: ContentCache, progress: Progress, runner: Runner = run) -> AgentDisk:
    """The agent disk, from the built-in base template's Debian tree (built once, cached)."""
    if not BUSYBOX.exists():
        raise ImageBuildError(f"{BUSYBOX} is missing: install Debian's busybox-static (make setup does)")
    tree = build_tree(cache, BASE_PACKAGES, progress, runner)
    inputs = {
        "tree": tree.parent.name,
        "busybox": hashlib.sha256(BUSYBOX.read_bytes()).hexdigest(),
        "agent": tree_hash(GUEST_PACKAGE_DIR),
        "init": hashlib.sha256(init_script()).hexdigest(),
        "layout": 2,
    }

    def build(out: Path) -> None:
        progress("assembling the agent disk (python3.11, its libraries, busybox, the guest agent)")
        staging = out / "staging"
        manifest = stage_agent_disk(tree, staging)
        check_runs(staging)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        image = out / "agent.ext4"
        used = sum(p.lstat().st_size for p in staging.rglob("*") if p.is_file() and not p.is_symlink())
        size_mib = int(used * 1.3) // (1 << 20) + 16
        runner(["mkfs.ext4", "-q", "-F", "-L", AGENT_LABEL, "-d", str(staging), str(image), f"{size_mib}M"])
        shutil.rmtree(staging)
        image.chmod(0o444)
        progress(f"agent disk ready ({size_mib} MiB ext4)")

    path, _ = cache.get_or_build("agentdisk", inputs, build)
    return AgentDisk(path)


def stage_agent_disk(tree: Path, staging: Path) -> dict[str, object]:
    """Write the agent disk's files for the Debian ``tree`` into ``staging``; returns its manifest."""
    staging.mkdir(parents=True)
    python = in_tree(tree, tree / "usr" / "bin" / PYTHON)
    stdlib = in_tree(tree, tree / "usr" / "lib" / PYTHON)
    if not python.is_file() or not stdlib.is_dir():
        raise ImageBuildError(f"{tree} has no {PYTHON}: the agent disk is made from a tree with python3")
    prefix = staging / "python"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(python, prefix / "bin" / PYTHON)
    target = prefix / "lib" / PYTHON
    shutil.copytree(stdlib, target, symlinks=True, ignore=_stdlib_ignore(stdlib))
    _drop_outside_links(target)
    dynload = target / "lib-dynload"
    extensions = sorted(p for p in dynload.iterdir() if p.name.endswith(".so"))
    found, missing = resolve_closure(tree, [python, *extensions])
    if python in missing:
        raise ImageBuildError(f"{PYTHON} in {tree} needs libraries the tree lacks: {missing[python]}")
    dropped = sorted(p.name for p in missing)
    for path in missing:
        (dynload / path.name).unlink()
    loader = find_library(tree, LOADER)
    if loader is None:
        raise ImageBuildError(f"{tree} has no {LOADER}")
    found[LOADER] = loader
    lib = staging / "lib"
    lib.mkdir()
    for soname, path in sorted(found.items()):
        shutil.copy2(path, lib / soname)
    shutil.copytree(GUEST_PACKAGE_DIR, target / "cryobox_guest", ignore=shutil.ignore_patterns("__pycache__"))
    _install_busybox(staging / "bin")
    init = staging / "init"
    init.write_bytes(init_script())
    init.chmod(0o755)
    return {
        "python": PYTHON,
        "libraries": sorted(found),
        "dropped_extensions": dropped,
        "busybox": hashlib.sha256(BUSYBOX.read_bytes()).hexdigest(),
        "mount": AGENT_MOUNT,
    }


def _stdlib_ignore(stdlib: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(directory: str, names: list[str]) -> set[str]:
        ignored = {n for n in names if n.startswith("config-")} if Path(directory) == stdlib else set()
        if Path(directory) == stdlib:
            ignored |= STDLIB_DROP & set(names)
        if Path(directory).name == "lib-dynload":
            ignored |= {n for n in names if n.startswith(EXTENSION_DROP_PREFIXES)}
        return ignored

    return ignore


def _drop_outside_links(root: Path) -> None:
    """Remove symlinks that are absolute or leave ``root`` (they would point into the image)."""
    top = root.resolve()
    for path in list(root.rglob("*")):
        if not path.is_symlink():
            continue
        target = os.readlink(path)
        resolved = (path.parent / target).resolve()
        if target.startswith("/") or (resolved != top and top not in resolved.parents):
            path.unlink()


def _install_busybox(bin_dir: Path) -> None:
    bin_dir.mkdir()
    shutil.copy2(BUSYBOX, bin_dir / "busybox")
    (bin_dir / "busybox").chmod(0o755)
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox" and "/" not in applet:
            (bin_dir / applet).symlink_to("busybox")


def loader_argv(root: str = AGENT_MOUNT) -> list[str]:
    """How the agent disk's python is started when the disk is at ``root`` (no environment variables)."""
    return [
        f"{root}/lib/{LOADER}",
        "--inhibit-cache",
        "--library-path",
        f"{root}/lib",
        f"{root}/python/bin/{PYTHON}",
    ]


def check_runs(staging: Path) -> None:
    """Run the staged python from ``staging`` (only its own files): compile the guest agent (the disk is
    read-only, so a guest could not write its bytecode) and import it. A disk whose interpreter cannot start is
    never cached.

    :raises ImageBuildError: it does not start, or it found a module outside ``staging``.
    """
    guest = staging / "python" / "lib" / PYTHON / "cryobox_guest"
    ddir = f"{AGENT_MOUNT}/python/lib/{PYTHON}/cryobox_guest"  # what tracebacks in the guest show
    compile_argv = [*loader_argv(str(staging)), "-I", "-S", "-m", "compileall", "-q", "-d", ddir, str(guest)]
    proc = subprocess.run(compile_argv, capture_output=True, text=True, env={}, timeout=300, cwd="/")
    if proc.returncode != 0:
        raise ImageBuildError(f"the agent disk's python cannot compile the guest agent: {proc.stdout[-2000:]}")
    probe = (
        "import sys, json, ssl, ctypes, cryobox_guest.agent; "
        "print(json.dumps({'prefix': sys.prefix, 'path': sys.path, 'modules': "
        "[getattr(m, '__file__', None) for m in list(sys.modules.values())]}))"
    )
    argv = [*loader_argv(str(staging)), "-I", "-S", "-c", probe]
    proc = subprocess.run(argv, capture_output=True, text=True, env={}, timeout=120, cwd="/")
    if proc.returncode != 0:
        raise ImageBuildError(f"the agent disk's python does not start: {proc.stderr.strip()[-2000:]}")
    seen = json.loads(proc.stdout)
    outside = [f for f in seen["modules"] if f and not f.startswith(str(staging))]
    if seen["prefix"] != str(staging / "python") or outside:
        raise ImageBuildError(f"the agent disk's python looked outside it: prefix {seen['prefix']}, {outside[:5]}")
