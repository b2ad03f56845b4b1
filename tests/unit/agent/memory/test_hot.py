"""HotImages: one copy per key however many ask, invalid keys refused, drop/wipe/close."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cryobox.agent.disk.volume import allocated_bytes, copy_sparse
from cryobox.agent.memory import hot
from cryobox.agent.memory.hot import PIN_S, HotBudgetExceeded, HotImages, default_budget, default_hot_dir
from cryobox.errors import InvalidArgument

MiB = 1 << 20


class CountingCopy:
    """Stands in for ``copy_sparse``: counts calls, is slow enough for callers to pile up, then really copies."""

    def __init__(self, real: Callable[[Path, Path], int]) -> None:
        self.real = real
        self.calls: list[tuple[Path, Path]] = []
        self.lock = threading.Lock()

    def __call__(self, src: Path, dst: Path) -> int:
        with self.lock:
            self.calls.append((src, dst))
        time.sleep(0.05)
        return self.real(src, dst)


def memory_image(path: Path) -> bytes:
    data = os.urandom(MiB)
    with open(path, "wb") as fh:
        fh.truncate(32 * MiB)
        fh.seek(8 * MiB)
        fh.write(data)
    return data


@pytest.fixture
def images(tmp_path: Path) -> HotImages:
    result = HotImages(tmp_path / "hot")
    result.wipe()
    return result


def test_default_hot_dir(tmp_path: Path) -> None:
    assert default_hot_dir(tmp_path, {"CRYOBOX_HOT_DIR": "/somewhere/else"}) == Path("/somewhere/else")
    default = default_hot_dir(tmp_path, {})
    assert default.parent == Path("/dev/shm") and default.name.startswith("cryobox-")
    assert len(default.name) == len("cryobox-") + 12
    assert default_hot_dir(tmp_path / "x" / "..", {}) == default  # the resolved data dir is what counts
    assert default_hot_dir(tmp_path / "other", {}) != default


async def test_ensure_copies_once_for_concurrent_callers(
    images: HotImages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "memory"
    data = memory_image(src)
    copy = CountingCopy(copy_sparse)
    monkeypatch.setattr(hot, "copy_sparse", copy)
    paths = await asyncio.gather(*(images.ensure("tmpl-abc123", src) for _ in range(8)))
    assert len(copy.calls) == 1
    assert set(paths) == {images.path("tmpl-abc123")} == {images.root / "tmpl-abc123" / "memory"}
    hot_path = paths[0]
    with open(hot_path, "rb") as fh:
        fh.seek(8 * MiB)
        assert fh.read(MiB) == data
    assert hot_path.stat().st_size == 32 * MiB
    assert allocated_bytes(hot_path) < 4 * MiB  # copied sparsely
    assert os.listdir(hot_path.parent) == ["memory"]  # no temp file left

    assert await images.ensure("tmpl-abc123", src) == hot_path  # present: not copied again
    assert len(copy.calls) == 1
    await asyncio.gather(images.ensure("a", src), images.ensure("b", src))  # other keys copy independently
    assert len(copy.calls) == 3
    assert not images._locks and not images._waiting  # per-key locks do not pile up


async def test_failed_copy_leaves_nothing_and_can_be_retried(images: HotImages, tmp_path: Path) -> None:
    src = tmp_path / "memory"
    with pytest.raises(FileNotFoundError):
        await images.ensure("k", src)
    assert not images.path("k").exists()
    memory_image(src)
    assert (await images.ensure("k", src)).exists()


@pytest.mark.parametrize("key", ["", ".", "..", "a/b", "../x", "a b", "x\0", "é", "k" * 201])
def test_bad_keys_are_rejected(images: HotImages, tmp_path: Path, key: str) -> None:
    with pytest.raises(InvalidArgument):
        images.path(key)
    with pytest.raises(InvalidArgument):
        images.drop(key)
    with pytest.raises(InvalidArgument):
        asyncio.run(images.ensure(key, tmp_path / "memory"))


def test_good_keys(images: HotImages) -> None:
    for key in ["a", "tmpl-0123abcdef", "snap_1.2", "...", "-x"]:
        assert images.path(key) == images.root / key / "memory"


async def test_drop_wipe_close(images: HotImages, tmp_path: Path) -> None:
    src = tmp_path / "memory"
    memory_image(src)
    one = await images.ensure("one", src)
    two = await images.ensure("two", src)
    images.drop("one")
    images.drop("one")  # idempotent
    images.drop("never")
    assert not one.parent.exists() and two.exists()

    with open(two, "rb") as mapped:  # a VM still mapping a file keeps it after a wipe
        images.wipe()
        assert images.root.is_dir() and list(images.root.iterdir()) == []
        mapped.seek(8 * MiB)
        assert len(mapped.read(MiB)) == MiB
    assert (images.root.stat().st_mode & 0o777) == 0o700

    await images.ensure("three", src)
    images.close()
    assert not images.root.exists()
    images.wipe()  # the next agent start
    assert images.root.is_dir()


def _image(path: Path, mib: int) -> Path:
    path.write_bytes(os.urandom(mib * MiB))
    return path


async def test_a_full_budget_evicts_unmapped_durable_copies_least_recently_ensured_first(tmp_path: Path) -> None:
    now = [1000.0]
    mapped: set[str] = set()
    hot = HotImages(tmp_path / "hot", budget_bytes=3 * MiB, in_use=lambda: mapped, clock=lambda: now[0])
    hot.wipe()
    a, b, c = (_image(tmp_path / n, 1) for n in "abc")
    await hot.ensure("a", a)
    now[0] += 100
    await hot.ensure("b", b)
    now[0] += 100
    await hot.ensure("c", c)
    assert hot.used_bytes() == 3 * MiB
    mapped.add("a")  # a VM maps a: b is the oldest evictable
    now[0] += 100
    await hot.ensure("d", _image(tmp_path / "d", 1))
    assert not hot.path("b").exists() and hot.path("a").exists() and hot.path("c").exists() and hot.evicted == 1
    assert hot.used_bytes() <= 3 * MiB


async def test_nothing_evictable_refuses_and_copies_nothing(tmp_path: Path) -> None:
    now = [1000.0]
    hot = HotImages(tmp_path / "hot", budget_bytes=2 * MiB, in_use=lambda: {"a"}, clock=lambda: now[0])
    hot.wipe()
    await hot.ensure("a", _image(tmp_path / "a", 1))  # mapped
    await hot.ensure("b", _image(tmp_path / "b", 1))  # ensured just now: pinned for a VM about to map it
    only = hot.path("snap")  # a capture's only copy (not made by ensure): never evicted
    only.parent.mkdir()
    with pytest.raises(HotBudgetExceeded) as refused:
        await hot.ensure("c", _image(tmp_path / "c", 1))
    assert refused.value.http_status == 503 and refused.value.details["budget_mib"] == 2
    assert not hot.path("c").exists() and hot.path("a").exists() and hot.path("b").exists()
    now[0] += PIN_S + 1  # b's pin runs out
    await hot.ensure("c", tmp_path / "c")
    assert not hot.path("b").exists() and hot.path("c").exists()


def test_default_budget(tmp_path: Path) -> None:
    assert default_budget(tmp_path, {"CRYOBOX_HOT_BUDGET_MIB": "100"}) == 100 * MiB
    stat = os.statvfs(tmp_path)
    assert default_budget(tmp_path, {}) == stat.f_blocks * stat.f_frsize * 3 // 4
    with pytest.raises(InvalidArgument):
        default_budget(tmp_path, {"CRYOBOX_HOT_BUDGET_MIB": "lots"})
