"""Layered snapshot memory: which pages a capture writes, the content digest, base copies on the volume, the
page map of a private mapping and the hot copies' holes given back after a capture."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import shutil
from pathlib import Path

import pytest

from cryobox.agent.memory.hot import HotImages
from cryobox.agent.snapshot.memlayer import (
    EMPTY_DIGEST,
    BaseImages,
    FullImage,
    LayerImage,
    ParentImage,
    chain_digest,
    clone_parent,
    image_digest,
)
from cryobox.agent.snapshot.pagemap import WrittenPages
from cryobox.errors import VmmError
from cryobox.util.files import allocated_bytes

PAGE = 4096


def _image(path: Path, pages: dict[int, int], size_pages: int = 64) -> Path:
    """A sparse image with page ``n`` filled with byte ``pages[n]``."""
    with open(path, "wb") as fh:
        fh.truncate(size_pages * PAGE)
        for n, byte in pages.items():
            os.pwrite(fh.fileno(), bytes([byte]) * PAGE, n * PAGE)
    return path


class _Written:
    """A page map stand-in: the pages named are written; counts how often its cache was dropped."""

    def __init__(self, pages: set[int] | None = None) -> None:
        self.pages = pages
        self.invalidated = 0

    def written(self, offset: int) -> bool:
        return self.pages is None or offset // PAGE in self.pages

    def invalidate(self) -> None:
        self.invalidated += 1


def _layer(tmp_path: Path, parent_pages: dict[int, int], written: set[int]) -> tuple[LayerImage, Path, int, int]:
    parent = _image(tmp_path / "parent", parent_pages)
    child = tmp_path / "child"
    shutil.copyfile(parent, child)  # what the reflink clone gives, without needing a reflink filesystem here
    fd = os.open(child, os.O_RDWR)
    parent_fd = os.open(parent, os.O_RDONLY)
    return LayerImage(fd, parent_fd, _Written(written), "p" * 64), child, fd, parent_fd


def test_a_layer_writes_only_the_changed_pages_and_the_flat_file_reads_right(tmp_path: Path) -> None:
    layer, child, fd, parent_fd = _layer(tmp_path, {1: 1, 2: 2, 3: 3}, written={2, 3, 5, 7})
    try:
        layer.page(1 * PAGE, memoryview(b"\x09" * PAGE))  # not written per the page map: stays the parent's
        layer.page(2 * PAGE, memoryview(b"\x02" * PAGE))  # written, same bytes: left shared
        layer.page(5 * PAGE, memoryview(b"\x05" * PAGE))  # written, new bytes
        layer.zero(3 * PAGE)  # written, now zero: becomes a hole
        layer.zero(7 * PAGE)  # written, zero as in the parent: nothing to do
    finally:
        os.close(fd)
        os.close(parent_fd)
    data = child.read_bytes()
    assert data[1 * PAGE : 2 * PAGE] == b"\x01" * PAGE
    assert data[2 * PAGE : 3 * PAGE] == b"\x02" * PAGE
    assert data[3 * PAGE : 4 * PAGE] == bytes(PAGE)
    assert data[5 * PAGE : 6 * PAGE] == b"\x05" * PAGE
    assert layer.own_pages == 1  # page 5 (the zeroed page 3 costs no block)
    assert layer.same_pages == 2
    assert set(layer.changes.pages) == {3 * PAGE, 5 * PAGE}


def test_a_page_sent_again_lands_even_when_it_is_back_to_the_parents_bytes(tmp_path: Path) -> None:
    # a pre-copy stream sends a page once per round: the last copy is the snapshot's
    layer, child, fd, parent_fd = _layer(tmp_path, {4: 4, 6: 6}, written={4, 6})
    try:
        layer.page(4 * PAGE, memoryview(b"\x0a" * PAGE))
        layer.page(4 * PAGE, memoryview(b"\x04" * PAGE))  # written back to what the parent has
        layer.zero(6 * PAGE)
        layer.page(6 * PAGE, memoryview(b"\x06" * PAGE))
        layer.refilled()
    finally:
        os.close(fd)
        os.close(parent_fd)
    data = child.read_bytes()
    assert data[4 * PAGE : 5 * PAGE] == b"\x04" * PAGE
    assert data[6 * PAGE : 7 * PAGE] == b"\x06" * PAGE
    assert isinstance(layer.written, _Written) and layer.written.invalidated == 1


def test_the_digest_names_the_content_over_the_parent(tmp_path: Path) -> None:
    def digest(parent: str, pages: list[tuple[int, bytes]]) -> str:
        work = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        work.mkdir()
        _image(work / "p", {})
        shutil.copyfile(work / "p", work / "c")
        fd, pfd = os.open(work / "c", os.O_RDWR), os.open(work / "p", os.O_RDONLY)
        layer = LayerImage(fd, pfd, _Written(), parent)
        for addr, data in pages:
            layer.page(addr, memoryview(data))
        try:
            return layer.digest()
        finally:
            os.close(fd)
            os.close(pfd)

    a = digest("a" * 64, [(0, b"x" * PAGE), (PAGE, b"y" * PAGE)])
    assert a == digest("a" * 64, [(PAGE, b"y" * PAGE), (0, b"x" * PAGE)])  # stream order does not matter
    assert a != digest("b" * 64, [(0, b"x" * PAGE), (PAGE, b"y" * PAGE)])  # another parent, another image
    assert a != digest("a" * 64, [(0, b"x" * PAGE), (PAGE, b"z" * PAGE)])


def test_a_full_image_writes_every_page_and_its_file_has_a_digest(tmp_path: Path) -> None:
    path = tmp_path / "full"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 64 * PAGE)
    full = FullImage(fd)
    full.page(3 * PAGE, memoryview(b"a" * PAGE))
    full.page(9 * PAGE, memoryview(b"b" * PAGE))
    full.page(11 * PAGE, memoryview(b"c" * PAGE))
    full.zero(11 * PAGE)  # sent again as zero (a stream that resends pages): a hole again
    full.zero(4 * PAGE)
    os.close(fd)
    assert full.own_pages == 2
    data = path.read_bytes()
    assert data[3 * PAGE : 4 * PAGE] == b"a" * PAGE and data[11 * PAGE : 12 * PAGE] == bytes(PAGE)
    assert allocated_bytes(path) <= 2 * PAGE + 4096 * 2
    same = _image(tmp_path / "same", {3: ord("a"), 9: ord("b")})
    assert image_digest(path) == image_digest(same)
    assert image_digest(path) != image_digest(_image(tmp_path / "other", {3: ord("a")}))
    assert image_digest(_image(tmp_path / "empty", {})) == chain_digest(EMPTY_DIGEST, [])


def test_clone_parent_refuses_a_parent_of_another_size(tmp_path: Path) -> None:
    parent = ParentImage("k", _image(tmp_path / "p", {0: 1}), "d")
    with pytest.raises(VmmError, match="is not"):
        clone_parent(parent, tmp_path / "c", 32 * PAGE)
    assert not (tmp_path / "c").exists()


def test_base_images_copy_a_parent_from_another_filesystem_once(tmp_path: Path) -> None:
    # the origin lives on tmpfs, the "volume" on the test's filesystem: a copy is made on the volume
    shm = Path(f"/dev/shm/cryobox-test-memlayer-{os.getpid()}")
    shm.mkdir()
    try:
        origin = _image(shm / "memory", {0: 7, 5: 8})
        bases = BaseImages(tmp_path / "vol" / "bases")
        (tmp_path / "vol").mkdir()

        first = asyncio.run(bases.parent("tpl-x", origin, None))
        assert first.path == tmp_path / "vol" / "bases" / "tpl-x" / "memory"
        assert first.path.read_bytes() == origin.read_bytes()
        assert first.digest == image_digest(origin)
        origin.unlink()  # the copy is what snapshots clone from now on
        again = asyncio.run(bases.parent("tpl-x", shm / "memory", None))
        assert again == first
        assert bases.prune(keep={"tpl-y"}) == ["tpl-x"]
        assert not first.path.exists()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_a_parent_on_the_volume_with_a_recorded_digest_is_used_in_place(tmp_path: Path) -> None:

    (tmp_path / "snapshots" / "snap-1").mkdir(parents=True)
    origin = _image(tmp_path / "snapshots" / "snap-1" / "memory", {0: 1})
    parent = asyncio.run(BaseImages(tmp_path / "bases").parent("snap-1", origin, "f" * 64))
    assert parent == ParentImage("snap-1", origin, "f" * 64)
    assert not (tmp_path / "bases").exists()


def _mapping_of(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def test_the_page_map_names_the_pages_a_process_wrote_in_its_private_mapping(tmp_path: Path) -> None:
    path = Path(f"/dev/shm/cryobox-test-pagemap-{os.getpid()}")
    try:
        _image(path, {n: 1 for n in range(16)}, size_pages=4096)
        with open(path, "rb+") as fh:
            m = mmap.mmap(fh.fileno(), 4096 * PAGE, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            for off in range(0, 4096 * PAGE, PAGE):
                m[off]  # read everything: present, still the file's pages
            for page in (2, 9, 3000):
                m[page * PAGE + 7] = 0x55
            lo = _mapping_of(m)
            with WrittenPages(os.getpid(), lo, lo + 4096 * PAGE, window_pages=1024) as pages:
                assert [n for n in range(4096) if pages.written(n * PAGE)] == [2, 9, 3000]
                assert pages.count() == 3
                with pytest.raises(VmmError, match="outside"):
                    pages.written(4096 * PAGE)
        finally:
            m.close()
    finally:
        path.unlink(missing_ok=True)


async def test_a_hot_copy_gets_its_holes_back_when_the_last_capture_ends(tmp_path: Path) -> None:
    root = Path(f"/dev/shm/cryobox-test-hot-{os.getpid()}")
    try:
        hot = HotImages(root)
        hot.wipe()
        src = _image(tmp_path / "memory", {0: 1, 1: 2}, size_pages=2048)
        copy = await hot.ensure("tpl-a", src)
        made = allocated_bytes(copy)
        assert made <= 64 * PAGE

        def read_all_through_a_private_mapping() -> None:
            with open(copy, "rb") as fh:
                m = mmap.mmap(fh.fileno(), 2048 * PAGE, mmap.MAP_PRIVATE, mmap.PROT_READ)
                for off in range(0, 2048 * PAGE, PAGE):
                    m[off]
                m.close()

        async with hot.capturing("tpl-a"):
            async with hot.capturing("tpl-a"):
                read_all_through_a_private_mapping()
            assert allocated_bytes(copy) == 2048 * PAGE  # a capture still runs: nothing punched
            assert hot.punch_zeros("tpl-a") == 0
        assert allocated_bytes(copy) == made
        assert hot.punched_bytes >= 2000 * PAGE
        assert copy.read_bytes()[:PAGE] == b"\x01" * PAGE
        async with hot.capturing(None):
            pass  # a VM that maps no hot copy
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_hot_copy_that_went_away_mid_capture_does_not_fail_the_capture(tmp_path: Path) -> None:
    root = Path(f"/dev/shm/cryobox-test-hot-gone-{os.getpid()}")
    try:
        hot = HotImages(root)
        hot.wipe()
        copy = await hot.ensure("tpl-b", _image(tmp_path / "memory", {0: 1}, size_pages=64))
        async with hot.capturing("tpl-b"):
            copy.unlink()
            copy.mkdir()  # something else took its place: punching it fails
        assert copy.is_dir()  # nothing raised out of the capture
    finally:
        shutil.rmtree(root, ignore_errors=True)
