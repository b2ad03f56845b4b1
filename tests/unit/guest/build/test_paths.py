"""resolve_in_root: symbolic links are followed inside the root, never out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cryobox.guest.build.errors import BuildError
from cryobox.guest.build.paths import inside, resolve_in_root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "etc").mkdir()
    return root


def test_plain_paths_and_a_leading_slash(root: Path) -> None:
    assert resolve_in_root(str(root), "/etc/passwd") == str(root / "etc" / "passwd")
    assert resolve_in_root(str(root), "etc//./passwd") == str(root / "etc" / "passwd")
    assert resolve_in_root(str(root), "/") == str(root)


def test_dotdot_stops_at_the_root(root: Path) -> None:
    assert resolve_in_root(str(root), "../../../etc/passwd") == str(root / "etc" / "passwd")
    assert resolve_in_root(str(root), "/usr/../../../x") == str(root / "x")


def test_an_absolute_symlink_in_a_parent_restarts_at_the_root(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "lib").symlink_to(str(outside))  # absolute, pointing at a real host directory
    (root / "abs").symlink_to("/usr/lib")
    assert resolve_in_root(str(root), "/abs/x") == str(root / "usr" / "lib" / "x")
    assert resolve_in_root(str(root), "/lib/x") == str(root / outside.relative_to("/") / "x")


def test_a_relative_symlink_pointing_up_stays_inside(root: Path) -> None:
    (root / "usr" / "lib" / "up").symlink_to("../../../../../../etc")
    assert resolve_in_root(str(root), "/usr/lib/up/shadow") == str(root / "etc" / "shadow")
    (root / "usr" / "sibling").symlink_to("lib")
    assert resolve_in_root(str(root), "/usr/sibling/z") == str(root / "usr" / "lib" / "z")


def test_the_final_component_is_followed_only_when_asked(root: Path) -> None:
    (root / "etc" / "resolv.conf").symlink_to("/run/resolv.conf")
    assert resolve_in_root(str(root), "/etc/resolv.conf") == str(root / "etc" / "resolv.conf")
    assert resolve_in_root(str(root), "/etc/resolv.conf", follow_final=True) == str(root / "run" / "resolv.conf")


def test_chains_of_links_and_missing_components(root: Path) -> None:
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("/c/../usr")
    assert resolve_in_root(str(root), "/a/lib/new/../file") == str(root / "usr" / "lib" / "file")


def test_a_link_loop_fails(root: Path) -> None:
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("/loop1")
    with pytest.raises(BuildError, match="too many levels"):
        resolve_in_root(str(root), "/loop1/x")


def test_a_nul_byte_fails(root: Path) -> None:
    with pytest.raises(BuildError, match="NUL"):
        resolve_in_root(str(root), "/etc/\0x")


def test_inside_names_a_host_path_as_the_target_sees_it(root: Path) -> None:
    assert inside(str(root), str(root / "etc" / "x")) == "/etc/x"
    assert inside(str(root), str(root)) == "/"
    assert os.path.isabs(inside(str(root), str(root / "y")))
