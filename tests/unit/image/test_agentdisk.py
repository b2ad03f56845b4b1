"""The agent disk's contents (staged from a Debian tree: the cached base tree, else this Debian host's own root)
and its init: everything resolves inside the disk, nothing points into the image."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from cryobox.image.agentdisk import (
    AGENT_MOUNT,
    LOADER,
    PYTHON,
    check_runs,
    init_script,
    loader_argv,
    stage_agent_disk,
)
from cryobox.image.elfdeps import is_elf, needed
from cryobox.image.initramfs import BUSYBOX
from cryobox.image.initramfs import init_script as initramfs_init


def _tree() -> Path:
    cached = sorted(Path("/var/cache/cryobox/images/debootstrap").glob("*/tree"))
    for tree in [*cached, Path("/")]:
        if (tree / "usr" / "bin" / PYTHON).exists():
            return tree
    pytest.skip("no Debian tree with python3.11 here")


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    staging = tmp_path_factory.mktemp("agentdisk") / "staging"
    manifest = stage_agent_disk(_tree(), staging)
    return staging, manifest


def test_every_library_an_elf_file_needs_is_on_the_disk(staged: tuple[Path, dict[str, object]]) -> None:
    staging, manifest = staged
    lib = staging / "lib"
    assert (lib / LOADER).is_file() and (lib / "libc.so.6").is_file()
    elves = [p for p in staging.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)]
    assert staging / "python" / "bin" / PYTHON in elves
    for path in elves:
        assert all((lib / name).is_file() for name in needed(path)), path
    assert sorted(p.name for p in lib.iterdir()) == manifest["libraries"]


def test_no_link_leaves_the_disk_and_nothing_reaches_into_the_image(staged: tuple[Path, dict[str, object]]) -> None:
    staging, _ = staged
    for path in staging.rglob("*"):
        if path.is_symlink():
            target = os.readlink(path)
            assert not target.startswith("/"), (path, target)
            assert staging.resolve() in (path.parent / target).resolve().parents, (path, target)
    stdlib = staging / "python" / "lib" / PYTHON
    assert not (stdlib / "sitecustomize.py").exists() and not list(stdlib.glob("config-*"))
    assert (stdlib / "cryobox_guest" / "__main__.py").is_file()
    assert (staging / "bin" / "busybox").read_bytes() == BUSYBOX.read_bytes()
    assert os.readlink(staging / "bin" / "sh") == "busybox"


def test_the_staged_python_runs_on_its_own_files(staged: tuple[Path, dict[str, object]]) -> None:
    staging, _ = staged
    check_runs(staging)  # raises unless sys.prefix and every imported module are inside the staging dir
    assert list((staging / "python" / "lib" / PYTHON / "cryobox_guest" / "__pycache__").glob("agent.*.pyc"))


def test_the_init_starts_the_agent_the_way_the_build_checked_it() -> None:
    script = init_script().decode()
    assert script.startswith(f"#!{AGENT_MOUNT}/bin/sh\n")
    line = " ".join(loader_argv("$A"))
    assert f"{line} -I -S -X utf8 -m cryobox_guest" in script
    assert "A=/.cryobox\n" in script


def test_the_init_uses_nothing_of_the_image() -> None:
    for number, line in enumerate(init_script().decode().splitlines()[1:], 2):
        code = line.split("#", 1)[0]
        if "PATH=" in code:  # the PATH user commands start with
            continue
        assert not re.search(r"(?<![\w$.])/(usr|s?bin|lib)/", code), f"line {number}: {line}"
        assert not re.search(r"(^|\s)(python3|bash|ip -batch)\b", code), f"line {number}: {line}"


@pytest.mark.parametrize("script", [init_script, initramfs_init])
def test_the_scripts_parse_under_busybox_sh(script: object, tmp_path: Path) -> None:
    path = tmp_path / "script"
    path.write_bytes(script())  # type: ignore[operator]
    proc = subprocess.run([str(BUSYBOX), "sh", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_initramfs_switches_to_the_agent_disk_only_when_asked() -> None:
    script = initramfs_init().decode()
    assert "cryobox.agentdisk=*" in script
    assert 'mount -t ext4 -o ro,noatime "$agentdisk" /newroot/.cryobox' in script
    assert "init=/sbin/cryobox-init\n" in script and "init=/.cryobox/init\n" in script
    assert script.rstrip().endswith("exec switch_root /newroot $init")
