"""DT_NEEDED read from ELF files without running them, and resolved inside a tree like the guest's loader."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cryobox.errors import ImageBuildError
from cryobox.image.elfdeps import find_library, in_tree, is_elf, needed, resolve_closure
from cryobox.image.initramfs import BUSYBOX

PYTHON = Path("/usr/bin/python3.11")


def test_needed_names_the_libraries_and_none_for_a_static_file(tmp_path: Path) -> None:
    if not PYTHON.exists():
        pytest.skip("no Debian python3.11 on this host")
    assert "libc.so.6" in needed(PYTHON)
    assert needed(BUSYBOX) == []
    text = tmp_path / "text"
    text.write_text("#!/bin/sh\n")
    assert not is_elf(text)
    with pytest.raises(ImageBuildError, match="not a little-endian ELF64"):
        needed(text)


def test_links_resolve_inside_the_tree(tmp_path: Path) -> None:
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "libx.so.1.2").write_bytes(b"x")
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "usr" / "lib" / "libx.so.1").symlink_to("/usr/lib/libx.so.1.2")  # absolute: the tree's, not ours
    assert in_tree(tmp_path, tmp_path / "lib" / "libx.so.1") == (tmp_path / "usr" / "lib" / "libx.so.1.2").resolve()
    assert find_library(tmp_path, "libx.so.1") == (tmp_path / "usr" / "lib" / "libx.so.1.2").resolve()
    assert find_library(tmp_path, "liby.so.1") is None
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(ImageBuildError, match="too many symlinks"):
        in_tree(tmp_path, tmp_path / "loop")
    (tmp_path / "up").symlink_to("../../../etc")  # clamped at the tree's root, like a chroot
    assert in_tree(tmp_path, tmp_path / "up") == tmp_path.resolve() / "etc"


def test_a_library_the_tree_lacks_is_reported_for_the_file_that_needs_it(tmp_path: Path) -> None:
    if not PYTHON.exists():
        pytest.skip("no Debian python3.11 on this host")
    (tmp_path / "bin").mkdir()
    shutil.copy2(PYTHON, tmp_path / "bin" / "python3.11")
    found, missing = resolve_closure(tmp_path, [tmp_path / "bin" / "python3.11"])
    assert found == {}
    assert "libc.so.6" in missing[tmp_path / "bin" / "python3.11"]
    found, missing = resolve_closure(Path("/"), [PYTHON])
    assert missing == {} and "libc.so.6" in found and "ld-linux-x86-64.so.2" in found
