"""The layer extractor against hostile archives: nothing outside the target changes, whatever the layer says."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cryobox.guest.build.errors import BuildError
from cryobox.guest.build.layers import Limits, layer_files, member_path, unpack
from tests.support.buildtar import TarWriter, file_state, tree_state


@dataclass
class Scene:
    root: Path
    layers: Path
    outside: Path
    logs: list[str]

    def unpack(self, *layers: TarWriter, limits: Limits | None = None) -> None:
        for index, layer in enumerate(layers):
            layer.write(self.layers / f"{index:03d}.tar")
        unpack(str(self.root), str(self.layers), limits or Limits(), self.logs.append)


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious\n")
    root = tmp_path / "root"
    root.mkdir()
    before, passwd = tree_state(outside), file_state("/etc/passwd")
    yield Scene(root, tmp_path / "layers", outside, [])
    assert tree_state(outside) == before, "something outside the target changed"
    assert file_state("/etc/passwd") == passwd


def test_member_names_are_normalised_and_dotdot_refused() -> None:
    assert member_path("/etc/passwd") == "etc/passwd"
    assert member_path("./usr//bin/") == "usr/bin"
    assert member_path("./") == ""
    for name in ("../x", "a/../../x", "a/.."):
        with pytest.raises(BuildError, match="'..'"):
            member_path(name)


def test_a_dotdot_member_fails_the_build_naming_it(scene: Scene) -> None:
    with pytest.raises(BuildError, match=r"refused tar member '\.\./\.\./outside/victim'"):
        scene.unpack(TarWriter().file("../../outside/victim", b"pwned"))


def test_absolute_member_names_land_inside(scene: Scene) -> None:
    victim = str(scene.outside / "victim")
    scene.unpack(TarWriter().file(victim, b"inside").file("/etc/motd", b"hi\n"))
    assert (scene.root / victim.lstrip("/")).read_bytes() == b"inside"
    assert (scene.root / "etc" / "motd").read_text() == "hi\n"


def test_a_file_written_through_an_absolute_symlink_stays_inside(scene: Scene) -> None:
    layer = TarWriter().symlink("escape", str(scene.outside)).file("escape/victim", b"pwned")
    scene.unpack(layer)
    assert os.readlink(scene.root / "escape") == str(scene.outside)  # the link itself is kept as written
    assert (scene.root / str(scene.outside).lstrip("/") / "victim").read_bytes() == b"pwned"


def test_a_relative_symlink_pointing_up_stays_inside(scene: Scene) -> None:
    up = "../" * 20 + str(scene.outside).lstrip("/")
    scene.unpack(TarWriter().dir("d").symlink("d/up", up).file("d/up/victim", b"pwned"))
    assert (scene.root / str(scene.outside).lstrip("/") / "victim").read_bytes() == b"pwned"


def test_a_symlink_at_the_final_component_is_replaced_not_followed(scene: Scene) -> None:
    layer1 = TarWriter().symlink("target", str(scene.outside / "victim"))
    layer2 = TarWriter().file("target", b"replaced")
    scene.unpack(layer1, layer2)
    assert not (scene.root / "target").is_symlink()
    assert (scene.root / "target").read_bytes() == b"replaced"


def test_a_hard_link_to_the_hosts_passwd_is_refused(scene: Scene) -> None:
    with pytest.raises(BuildError, match="refused hard link 'stolen' -> '/etc/passwd'"):
        scene.unpack(TarWriter().hardlink("stolen", "/etc/passwd"))
    with pytest.raises(BuildError, match="'..' in its target"):
        scene.unpack(TarWriter().hardlink("stolen", "../../../../etc/passwd"))


def test_a_hard_link_through_a_symlinked_parent_is_resolved_in_root(scene: Scene) -> None:
    layer = TarWriter().dir("etc").file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n").symlink("host", "/")
    scene.unpack(layer.hardlink("copy", "host/etc/passwd"))
    assert os.path.samefile(scene.root / "copy", scene.root / "etc" / "passwd")


def test_a_hard_link_to_a_directory_is_refused(scene: Scene) -> None:
    with pytest.raises(BuildError, match="not a file in the image"):
        scene.unpack(TarWriter().dir("d").hardlink("link", "d"))


def test_device_nodes_are_skipped_with_a_logged_line(scene: Scene) -> None:
    scene.unpack(TarWriter().dir("dev").device("dev/null").device("dev/sda", 8, 0))
    assert not os.path.lexists(scene.root / "dev" / "null")
    assert any("skipped device node /dev/null" in line for line in scene.logs)


def test_fifos_setuid_owner_mode_and_mtime(scene: Scene) -> None:
    layer = (
        TarWriter()
        .dir("usr/bin", mode=0o755)
        .file("usr/bin/su", b"\x7fELF", mode=0o4755, uid=0, gid=0)
        .file("usr/bin/wall", b"x", mode=0o2755, uid=0, gid=5)
        .file("home/app/data", b"d", mode=0o600, uid=1234, gid=4321, mtime=1_000_000_000)
        .fifo("run/fifo")
        .dir("home/app", mode=0o750, uid=1234, gid=4321, mtime=1_100_000_000)
    )
    scene.unpack(layer)
    su = os.stat(scene.root / "usr" / "bin" / "su")
    assert stat.S_IMODE(su.st_mode) == 0o4755
    assert stat.S_IMODE(os.stat(scene.root / "usr" / "bin" / "wall").st_mode) == 0o2755
    data = os.stat(scene.root / "home" / "app" / "data")
    assert (data.st_uid, data.st_gid, stat.S_IMODE(data.st_mode), int(data.st_mtime)) == (1234, 4321, 0o600, 10**9)
    app = os.stat(scene.root / "home" / "app")
    assert (app.st_uid, stat.S_IMODE(app.st_mode), int(app.st_mtime)) == (1234, 0o750, 1_100_000_000)
    assert stat.S_ISFIFO(os.lstat(scene.root / "run" / "fifo").st_mode)


def test_whiteouts_and_opaque_directories_across_two_layers(scene: Scene) -> None:
    lower = (
        TarWriter()
        .file("etc/keep", b"k")
        .file("etc/gone", b"g")
        .dir("etc/gonedir")
        .file("etc/gonedir/inner", b"i")
        .file("opaque/old1", b"1")
        .dir("opaque/sub")
        .file("opaque/sub/old2", b"2")
        .symlink("link", str(scene.outside))
    )
    upper = (
        TarWriter()
        .file("etc/.wh.gone")
        .file("etc/.wh.gonedir")
        .file("opaque/new-before", b"n")  # written before the marker: kept
        .dir("opaque/sub")
        .file("opaque/.wh..wh..opq")
        .file("opaque/sub/new-after", b"a")
        .file("link/.wh.victim")  # through a symlink: resolved in the root, the host's file stays
        .file(".wh.link")
    )
    scene.unpack(lower, upper)
    assert (scene.root / "etc" / "keep").exists()
    assert not os.path.lexists(scene.root / "etc" / "gone")
    assert not os.path.lexists(scene.root / "etc" / "gonedir")
    assert sorted(os.listdir(scene.root / "opaque")) == ["new-before", "sub"]
    assert os.listdir(scene.root / "opaque" / "sub") == ["new-after"]
    assert not os.path.lexists(scene.root / "link")
    assert not any(name.startswith(".wh.") for _, dirs, files in os.walk(scene.root) for name in dirs + files)


def test_a_file_replaces_a_directory_and_a_directory_a_file(scene: Scene) -> None:
    scene.unpack(TarWriter().file("a/b", b"x").file("c", b"y"), TarWriter().file("a", b"now a file").dir("c"))
    assert (scene.root / "a").read_bytes() == b"now a file"
    assert (scene.root / "c").is_dir()


def test_limits_on_bytes_and_entries(scene: Scene) -> None:
    with pytest.raises(BuildError, match="more than 10 bytes"):
        scene.unpack(TarWriter().file("big", b"x" * 11), limits=Limits(max_bytes=10))
    with pytest.raises(BuildError, match="more than 2 entries"):
        scene.unpack(TarWriter().file("a").file("b").file("c"), limits=Limits(max_entries=2))
    assert Limits.from_json({"max_bytes": 5}) == Limits(max_bytes=5)


def test_layers_apply_in_numeric_order(scene: Scene, tmp_path: Path) -> None:
    for index in (10, 2, 1):
        TarWriter().file("which", str(index).encode()).write(scene.layers / f"{index:03d}.tar")
    (scene.layers / "notes.txt").write_text("ignored")
    assert [os.path.basename(p) for p in layer_files(str(scene.layers))] == ["001.tar", "002.tar", "010.tar"]
    unpack(str(scene.root), str(scene.layers), Limits(), scene.logs.append)
    assert (scene.root / "which").read_text() == "10"


def test_a_corrupt_layer_fails_cleanly(scene: Scene) -> None:
    scene.layers.mkdir()
    (scene.layers / "000.tar").write_bytes(b"not a tar" * 100)
    with pytest.raises(BuildError, match="not a valid tar archive"):
        unpack(str(scene.root), str(scene.layers), Limits(), scene.logs.append)
