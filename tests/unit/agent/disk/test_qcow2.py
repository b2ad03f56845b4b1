"""qcow2 backing chains read from the headers: images made by ``qemu-img`` and hand-crafted ones."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from cryobox.agent.disk.qcow2 import MAGIC, MAX_DEPTH, backing_chain, backing_file
from cryobox.errors import VmmError

needs_qemu_img = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")


def _raw(path: Path, size: int = 1 << 20) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def _qemu_img(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *args], check=True, cwd=cwd, capture_output=True)


def _header(path: Path, name: bytes, *, size: int | None = None, offset: int = 512) -> Path:
    """A qcow2 header naming ``name`` as its backing file (``size`` overrides the recorded length)."""
    header = MAGIC + struct.pack(">I", 3) + struct.pack(">QI", offset, len(name) if size is None else size)
    path.write_bytes(header.ljust(offset, b"\0") + name)
    return path


@needs_qemu_img
def test_overlay_of_a_raw_file(tmp_path: Path) -> None:
    raw = _raw(tmp_path / "rootfs.raw")
    overlay = tmp_path / "disk.qcow2"
    _qemu_img("-F", "raw", "-b", str(raw), str(overlay))
    assert backing_file(overlay) == raw
    assert backing_chain(overlay) == [raw]


@needs_qemu_img
def test_chain_of_three_nearest_first_with_a_relative_name(tmp_path: Path) -> None:
    layers = tmp_path / "layers"
    layers.mkdir()
    raw = _raw(layers / "rootfs.raw")
    _qemu_img("-F", "raw", "-b", str(raw), str(layers / "base.qcow2"))
    _qemu_img("-F", "qcow2", "-b", "base.qcow2", "mid.qcow2", cwd=layers)  # recorded as "base.qcow2"
    run = tmp_path / "run"
    run.mkdir()
    top = run / "disk.qcow2"
    _qemu_img("-F", "qcow2", "-b", str(layers / "mid.qcow2"), str(top))

    chain = backing_chain(top)

    assert chain == [layers / "mid.qcow2", layers / "base.qcow2", raw]
    assert all(p.is_absolute() and p.is_file() for p in chain)
    assert top not in chain


@needs_qemu_img
def test_relative_name_resolves_against_the_image_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    raw = _raw(images / "rootfs.raw")
    _qemu_img("-F", "raw", "-b", "../rootfs.raw", "overlay.qcow2", cwd=images / "sub")
    monkeypatch.chdir(tmp_path)
    (chain_entry,) = backing_chain(images / "sub" / "overlay.qcow2")
    assert chain_entry == images / "sub" / ".." / "rootfs.raw"
    assert chain_entry.resolve() == raw.resolve()


@needs_qemu_img
def test_raw_and_standalone_images_have_no_backing(tmp_path: Path) -> None:
    raw = _raw(tmp_path / "rootfs.raw")
    assert backing_file(raw) is None
    assert backing_chain(raw) == []
    standalone = tmp_path / "plain.qcow2"
    _qemu_img(str(standalone), "1M")
    assert backing_file(standalone) is None
    assert backing_chain(standalone) == []
    short = tmp_path / "short"
    short.write_bytes(MAGIC + b"\0\0\0\3")  # shorter than a header
    assert backing_file(short) is None


def test_a_zero_offset_or_size_means_no_backing(tmp_path: Path) -> None:
    assert backing_file(_header(tmp_path / "a.qcow2", b"x.raw", size=0)) is None
    no_offset = tmp_path / "b.qcow2"
    no_offset.write_bytes(MAGIC + struct.pack(">I", 3) + struct.pack(">QI", 0, 5) + b"x.raw")
    assert backing_file(no_offset) is None


def test_a_huge_backing_name_is_refused(tmp_path: Path) -> None:
    image = _header(tmp_path / "evil.qcow2", b"a" * 2000)
    with pytest.raises(VmmError, match="2000 bytes"):
        backing_file(image)
    with pytest.raises(VmmError):
        backing_chain(image)
    assert backing_file(_header(tmp_path / "ok.qcow2", b"/" + b"a" * 1022)) == Path("/" + "a" * 1022)


def test_a_loop_is_refused(tmp_path: Path) -> None:
    _header(tmp_path / "a.qcow2", b"b.qcow2")
    _header(tmp_path / "b.qcow2", b"a.qcow2")
    with pytest.raises(VmmError, match="loops"):
        backing_chain(tmp_path / "a.qcow2")
    with pytest.raises(VmmError):
        backing_chain(_header(tmp_path / "self.qcow2", b"self.qcow2"))


def test_depth_limit(tmp_path: Path) -> None:
    def chain_of(n: int, where: Path) -> Path:
        where.mkdir()
        _raw(where / f"{n}.img", 512)
        for i in range(n):
            _header(where / f"{i}.img", f"{i + 1}.img".encode())
        return where / "0.img"

    assert len(backing_chain(chain_of(MAX_DEPTH, tmp_path / "deep"))) == MAX_DEPTH
    with pytest.raises(VmmError, match="too deep"):
        backing_chain(chain_of(MAX_DEPTH + 1, tmp_path / "deeper"))
