"""Durable file helpers."""

from __future__ import annotations

import os
from pathlib import Path

from cryobox.util.files import allocated_bytes, stable_hash, tree_hash, write_atomic, write_json_atomic

MiB = 1 << 20


def test_write_atomic_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"first")
    assert target.read_bytes() == b"first"
    write_atomic(target, b"second, longer")
    assert target.read_bytes() == b"second, longer"
    write_atomic(target, b"")
    assert target.read_bytes() == b""
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_write_atomic_keeps_hardlinked_old_version(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_atomic(target, b"old")
    os.link(target, tmp_path / "snapshot")
    write_atomic(target, b"new")
    # replaced by rename, not rewritten in place
    assert (tmp_path / "snapshot").read_bytes() == b"old"
    assert target.read_bytes() == b"new"


def test_write_json_atomic_is_sorted(tmp_path: Path) -> None:
    target = tmp_path / "v.json"
    write_json_atomic(target, {"b": 1, "a": [1, 2]})
    text = target.read_text()
    assert text.endswith("\n")
    assert text.index('"a"') < text.index('"b"')


def test_stable_hash() -> None:
    a = {"x": 1, "y": {"p": [1, 2], "q": "s"}}
    b = {"y": {"q": "s", "p": [1, 2]}, "x": 1}
    assert stable_hash(a) == stable_hash(b)
    assert len(stable_hash(a)) == 16
    assert len(stable_hash(a, length=40)) == 40
    assert stable_hash(a, length=40).startswith(stable_hash(a))
    assert stable_hash(a) != stable_hash({**a, "x": 2})
    assert stable_hash([1, 2]) != stable_hash([2, 1])
    assert stable_hash({"n": 1}) != stable_hash({"n": "1"})


def _tree(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "pkg" / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return root


def test_tree_hash(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one")
    two = _tree(tmp_path / "two")
    base = tree_hash(one)
    assert base == tree_hash(two)  # location independent

    (one / "pkg" / "__pycache__").mkdir()
    (one / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"bytecode")
    assert tree_hash(one) == base

    (one / "pkg" / "mod.py").write_text("X = 2\n")
    changed = tree_hash(one)
    assert changed != base
    (one / "pkg" / "mod.py").write_text("X = 1\n")
    assert tree_hash(one) == base

    (one / "pkg" / "sub" / "data.bin").rename(one / "pkg" / "sub" / "renamed.bin")
    assert tree_hash(one) != base


def test_allocated_bytes_sparse(tmp_path: Path) -> None:
    sparse = tmp_path / "memory.img"
    with open(sparse, "wb") as fh:
        fh.truncate(100 * MiB)
    assert sparse.stat().st_size == 100 * MiB
    assert allocated_bytes(sparse) < 1 * MiB

    dense = tmp_path / "dense.bin"
    with open(dense, "wb") as fh:
        fh.write(os.urandom(2 * MiB))
        fh.flush()
        os.fsync(fh.fileno())
    dense_alloc = allocated_bytes(dense)
    assert 2 * MiB <= dense_alloc < 3 * MiB

    os.symlink(dense, tmp_path / "link")
    total = allocated_bytes(tmp_path)
    assert total == allocated_bytes(sparse) + dense_alloc
