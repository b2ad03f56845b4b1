"""The step layer cache with real qcow2 files: store rebases onto the parent, lookup checks the whole chain,
a second store of a key loses, trim removes the least recently used."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cryobox.agent.disk.qcow2 import backing_chain, create_overlay
from cryobox.agent.templates.layercache import LayerCache
from tests.support.qcowlayers import make_base, write


def test_store_rebases_and_lookup_follows_the_chain(tmp_path: Path) -> None:
    base = make_base(tmp_path)
    session = tmp_path / "session"
    session.mkdir()
    first, second = session / "l1.qcow2", session / "l2.qcow2"
    create_overlay(first, base, 8 << 20)
    write(first, 0, b"\x01" * 512)
    create_overlay(second, first)
    write(second, 4096, b"\x02" * 512)
    cache = LayerCache(tmp_path / "steps")
    one = cache.store("k1", first, base)
    assert one is not None and backing_chain(one) == [base]
    two = cache.store("k2", second, one)
    assert two is not None and backing_chain(two) == [one, base]
    for leftover in session.iterdir():
        leftover.unlink()
    assert cache.lookup("k2") == two
    out = tmp_path / "flat.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(two), str(out)], check=True)
    data = out.read_bytes()
    assert data[:512] == b"\x01" * 512 and data[4096:4608] == b"\x02" * 512
    assert cache.store("k1", first if first.exists() else two, base) is None  # already cached: ours is not kept


def test_lookup_refuses_a_broken_chain_and_trim_drops_least_recently_used(tmp_path: Path) -> None:
    base = make_base(tmp_path)
    layer = tmp_path / "l.qcow2"
    create_overlay(layer, base, 8 << 20)
    cache = LayerCache(tmp_path / "steps")
    kept = [cache.store(key, layer, base) for key in ("old", "mid", "new")]
    assert all(kept)
    for age, key in enumerate(("old", "mid", "new")):
        os.utime(tmp_path / "steps" / key, (1000 + age, 1000 + age))
    size = cache.size()
    assert cache.trim(size - 1) == ["old"]
    assert cache.lookup("old") is None and cache.lookup("mid") is not None
    base.unlink()
    assert cache.lookup("new") is None  # its backing file is gone: a miss, not a broken build
