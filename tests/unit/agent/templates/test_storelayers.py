"""The step cache through a real file:// store with real qcow2 layers: a chain one host publishes is found by
another (the same flattened bytes), and a corrupted layer, another base or another build of the parent is a miss;
after a build the store is touched at most hourly and trimmed to its budget."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cryobox.agent.disk.qcow2 import backing_chain
from cryobox.agent.templates.layercache import LayerCache
from cryobox.agent.templates.storelayers import StoreLayers
from cryobox.objstore.buildsteps import read_meta, trim_steps
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.keys import build_step_meta
from tests.support.qcowlayers import cut, flatten, make_base

K1, K2, K3 = ("1" * 64, "2" * 64, "3" * 64)
BASE_KEY = "b" * 64  # a Debian or template base's key: not a layer
BIG = 1 << 40


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _host_a(tmp_path: Path, store: ObjectStore) -> tuple[Path, LayerCache, list[Path]]:
    """Host A: a base and the chain base -> K1 -> K2, published."""
    base = make_base(tmp_path, "a-base.raw", fill=7)
    cache = LayerCache(tmp_path / "a" / "steps")
    one = cut(cache, K1, base, 0, 1, tmp_path / "a" / "session")
    two = cut(cache, K2, one, 8192, 2, tmp_path / "a" / "session")
    done = StoreLayers(store, cache).after_build([BASE_KEY, K1, K2], BIG)
    assert done.keys == [K1, K2] and done.bytes > 0 and done.trimmed == 0
    return base, cache, [one, two]


def _host_b(tmp_path: Path, store: ObjectStore, base_src: Path, **kw: object) -> tuple[Path, StoreLayers]:
    """Host B: its own copy of the base, at another path; an empty step cache."""
    (tmp_path / "b").mkdir(exist_ok=True)
    base = tmp_path / "b" / "rootfs.ext4"
    shutil.copyfile(base_src, base)
    return base, StoreLayers(store, LayerCache(tmp_path / "b" / "steps"), **kw)  # type: ignore[arg-type]


def test_another_host_finds_the_chain_through_the_store(tmp_path: Path, store: ObjectStore) -> None:
    _, a_cache, (_, a_two) = _host_a(tmp_path, store)
    meta = read_meta(store, K2)
    assert meta is not None and meta.parent == K1 and meta.parent_version == a_cache.version(K1)
    root = read_meta(store, K1)
    assert root is not None and root.parent is None and root.base is not None
    assert store.list(f"build-steps/{K1}") == [root.layer_key, build_step_meta(K1)]

    lines: list[str] = []
    b_base, b = _host_b(tmp_path, store, tmp_path / "a-base.raw", log=lines.append)
    one = b.find(K1, b_base)
    assert one is not None and backing_chain(one) == [b_base]
    two = b.find(K2, one)
    assert two is not None and backing_chain(two) == [one, b_base]
    assert flatten(two, tmp_path / "b.raw") == flatten(a_two, tmp_path / "a.raw")
    assert b.layers.version(K2) == a_cache.version(K2) and b.layers.lookup(K2) == two
    assert any("fetched from the store" in line for line in lines), lines
    assert b.find(K3, two) is None  # not in the store: a plain miss
    assert b.after_build([BASE_KEY, K1, K2], BIG).keys == []  # the store has them already


def test_a_corrupted_stored_layer_is_refused(tmp_path: Path, store: ObjectStore) -> None:
    _host_a(tmp_path, store)
    meta = read_meta(store, K1)
    assert meta is not None
    store.put(meta.layer_key, b"QFI\xfb" + b"\0" * (meta.size - 4))  # same size, other bytes
    lines: list[str] = []
    b_base, b = _host_b(tmp_path, store, tmp_path / "a-base.raw", log=lines.append)
    assert b.find(K1, b_base) is None
    assert any("is not what its meta pins" in line for line in lines), lines
    assert not b.layers.root.exists() or list(b.layers.root.iterdir()) == []  # nothing half-fetched is left
    # pinned right, but a qcow2 with an external data file (a host path QEMU would open): refused too
    evil = tmp_path / "evil.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={tmp_path / 'host-file'}", str(evil), "1M"],
        check=True,
    )
    data = evil.read_bytes()
    forged = dataclasses.replace(meta, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    store.put(forged.layer_key, data)
    store.put(build_step_meta(K1), forged.to_bytes())
    assert b.find(K1, b_base) is None
    assert any("not a plain qcow2 layer" in line for line in lines), lines


def test_a_chain_over_a_base_or_parent_this_host_lacks_is_a_miss(tmp_path: Path, store: ObjectStore) -> None:
    _host_a(tmp_path, store)
    other = make_base(tmp_path, "other.raw", fill=9)
    lines: list[str] = []
    b_base, b = _host_b(tmp_path, store, other, log=lines.append)
    assert b.find(K1, b_base) is None
    assert any("base image this host does not have" in line for line in lines)
    # this host's own build of K1 (another version): the stored K2 does not sit on it
    own = cut(b.layers, K1, b_base, 0, 1, tmp_path / "b" / "session")
    assert b.find(K2, own) is None
    assert any("another build of its parent" in line for line in lines)
    assert b.after_build([K1, K2], BIG).keys == []  # nor does it publish over the store's K1


def test_after_a_build_last_used_is_rewritten_at_most_hourly(tmp_path: Path, store: ObjectStore) -> None:
    _host_a(tmp_path, store)
    clock = Clock()
    b_base, b = _host_b(tmp_path, store, tmp_path / "a-base.raw", wall=clock)
    one = b.find(K1, b_base)
    assert one is not None and b.find(K2, one) is not None
    before = read_meta(store, K2)
    assert before is not None
    clock.now += 1800
    b.after_build([K1, K2], BIG)
    assert read_meta(store, K2) == before  # fetched half an hour ago: not even read
    clock.now += 3 * 3600
    b.after_build([K1, K2], BIG)
    after = read_meta(store, K2)
    assert after is not None and after.last_used == clock.now and after.sha256 == before.sha256


def test_the_store_is_trimmed_least_recently_used_first_with_children(tmp_path: Path, store: ObjectStore) -> None:
    base, cache, (one, _) = _host_a(tmp_path, store)
    three = cut(cache, K3, base, 0, 3, tmp_path / "a" / "session")  # a second chain, used later
    clock = Clock()
    clock.now += 7200
    shared = StoreLayers(store, cache, wall=clock)
    assert shared.after_build([K3], BIG).keys == [K3]
    for key in (K1, K2):  # the first chain was last used two hours ago
        meta = json.loads(store.get(build_step_meta(key)))
        assert meta["last_used"] < clock.now - 3600
    size = sum(m.size for m in store.list_meta("build-steps"))
    k2_size = sum(m.size for m in store.list_meta(f"build-steps/{K2}"))
    assert shared.after_build([K3], size - 1).trimmed == 2  # the least recently used leaf is enough
    assert store.list(f"build-steps/{K2}") == [] and read_meta(store, K1) is not None
    removed = trim_steps(store, size - k2_size - 1, clock.now)
    assert [r.key.split("/")[1] for r in removed] == [K1, K1] and removed[0].key == build_step_meta(K1)
    assert store.list("build-steps") == sorted(store.list(f"build-steps/{K3}"))
    assert one.exists() and three.exists()  # the local cache is the host's own (CRYOBOX_BUILD_CACHE_BYTES)
