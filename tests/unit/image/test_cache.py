"""ContentCache: build once, complete-or-absent, keyed by inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryobox.image.cache import ContentCache


class Builder:
    def __init__(self, content: bytes = b"built", fail: bool = False) -> None:
        self.calls: list[Path] = []
        self.content = content
        self.fail = fail

    def __call__(self, out: Path) -> None:
        self.calls.append(out)
        (out / "artifact").write_bytes(self.content)
        (out / "sub").mkdir()
        if self.fail:
            raise RuntimeError("build exploded")


def test_builds_once(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path / "cache")
    builder = Builder()
    path, built = cache.get_or_build("kernel", {"version": "6.1"}, builder)
    assert built is True
    assert len(builder.calls) == 1
    assert builder.calls[0] != path  # built elsewhere, then moved into place
    assert (path / "artifact").read_bytes() == b"built"
    assert path.parent == tmp_path / "cache" / "kernel"

    again = Builder(b"other")
    path2, built2 = cache.get_or_build("kernel", {"version": "6.1"}, again)
    assert path2 == path
    assert built2 is False
    assert again.calls == []
    assert (path / "artifact").read_bytes() == b"built"


def test_failed_build_leaves_nothing_complete(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path / "cache")
    inputs = {"version": "6.1"}
    with pytest.raises(RuntimeError, match="exploded"):
        cache.get_or_build("kernel", inputs, Builder(fail=True))
    final = cache.path_for("kernel", inputs)
    assert not final.exists()
    leftovers = [p.name for p in final.parent.iterdir()]
    assert not any("building" in name for name in leftovers), leftovers
    assert all(not (final.parent / name).is_dir() for name in leftovers), leftovers

    # the next attempt builds for real
    builder = Builder(b"second try")
    path, built = cache.get_or_build("kernel", inputs, builder)
    assert built is True and len(builder.calls) == 1
    assert (path / "artifact").read_bytes() == b"second try"


def test_different_inputs_different_paths(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path)
    a, _ = cache.get_or_build("kernel", {"version": "6.1"}, Builder(b"a"))
    b, _ = cache.get_or_build("kernel", {"version": "6.2"}, Builder(b"b"))
    c, _ = cache.get_or_build("initramfs", {"version": "6.1"}, Builder(b"c"))
    assert len({a, b, c}) == 3
    assert (a / "artifact").read_bytes() == b"a"
    assert (b / "artifact").read_bytes() == b"b"
    assert (c / "artifact").read_bytes() == b"c"


def test_dict_order_does_not_matter(tmp_path: Path) -> None:
    cache = ContentCache(tmp_path)
    one = {"package": "linux", "version": "6.1", "nested": {"x": 1, "y": [1, 2]}}
    two = {"nested": {"y": [1, 2], "x": 1}, "version": "6.1", "package": "linux"}
    assert cache.path_for("kernel", one) == cache.path_for("kernel", two)
    assert cache.path_for("kernel", one) != cache.path_for("kernel", {**one, "nested": {"x": 1, "y": [2, 1]}})
    cache.get_or_build("kernel", one, Builder())
    builder = Builder()
    _, built = cache.get_or_build("kernel", two, builder)
    assert built is False and builder.calls == []
