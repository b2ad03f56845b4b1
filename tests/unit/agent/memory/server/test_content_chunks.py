"""Content-addressed chunks: a chunk is stored once however many images hold it, uploaded only when the store
lacks it, and cached by sha256, so a template's restores warm its snapshots' (a file:// store, no QEMU VM)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from cryobox.agent.memory.server.chunkcache import ChunkCache
from cryobox.agent.memory.server.fusefs import file_name
from cryobox.agent.memory.server.main import MemoryServer
from cryobox.agent.memory.server.resolver import ResolverConfig
from cryobox.agent.publish.templates import publish_snapshot, publish_template, upload_image
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agent.templates.bake import Template
from cryobox.objstore.chunkfmt import CHUNK_SIZE, ChunkIndex, chunk_key, scan_image
from cryobox.objstore.client import ObjectStore
from cryobox.objstore.pins import PinSet
from tests.support.images import ROOTFS, baked_template, file_store, make_qcow2, sparse_image

PAGES = {0: b"kernel text", 1: b"page cache", 2: b"heap", 3: b"stack", 4: b"more heap"}


def make_template(tmp_path: Path) -> Template:
    """A baked template whose memory has 5 stored chunks (and 3 zero ones)."""
    template = baked_template(tmp_path / "a")
    sparse_image(template.memory, 8, PAGES)
    return template


def _snapshot_of(template: Template, root: Path, snapshot_id: str, changes: dict[int, bytes]) -> SnapshotImage:
    """A snapshot of ``template`` whose memory is the template's with ``changes`` written over it."""
    path = root / snapshot_id
    path.mkdir(parents=True)
    make_qcow2(path / "disk.qcow2", template.disk)
    (path / "vmstate").write_bytes(b"device state of " + snapshot_id.encode())
    shutil.copyfile(template.memory, path / "memory")
    with open(path / "memory", "r+b") as fh:
        for i, data in changes.items():
            fh.seek(i * CHUNK_SIZE + 100)
            fh.write(data)
    manifest = {"id": snapshot_id, "template": "base", "machine": template.machine.to_json(), "created_at": 1.0}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return SnapshotImage(snapshot_id, path, template.machine, manifest)


def _chunk_objects(store: ObjectStore) -> list[str]:
    return store.list("chunks")


def _digests(path: Path) -> set[str]:
    return set(scan_image(path, "x").digests())


def test_a_store_holds_each_distinct_chunk_once(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template = make_template(tmp_path)
    publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    rootfs = tmp_path / "a" / "images" / ROOTFS
    assert len(_chunk_objects(store)) == len(_digests(template.memory) | _digests(rootfs)) == 5 + 2

    # two snapshots: one chunk changed in each, the same new chunk 6 in both
    one = _snapshot_of(template, tmp_path / "snaps", "snap-1", {3: b"changed stack", 6: b"fresh"})
    two = _snapshot_of(template, tmp_path / "snaps", "snap-2", {4: b"other heap", 6: b"fresh"})
    puts = store.stats.puts
    publish_snapshot(store, one, template)
    # uploaded: the 2 chunks the store lacked, the lease, the index, vmstate, disk, manifest
    assert store.stats.puts - puts == 2 + 5
    puts = store.stats.puts
    publish_snapshot(store, two, template)
    assert store.stats.puts - puts == 1 + 5  # only chunk 4's new bytes: 6 is snap-1's

    every = _digests(template.memory) | _digests(rootfs) | _digests(one.memory) | _digests(two.memory)
    assert len(every) == 5 + 2 + 3
    assert sorted(_chunk_objects(store)) == sorted(chunk_key(d) for d in every)
    for key in _chunk_objects(store):  # each named by the sha256 of its bytes
        assert hashlib.sha256(store.get(key)).hexdigest() == key.rsplit("/", 1)[1]
    assert store.list("snapshots/snap-1") == [
        f"snapshots/snap-1/{n}" for n in ("disk.qcow2", "manifest.json", "memory.idx", "vmstate")
    ]
    manifest = json.loads(store.get("snapshots/snap-1/manifest.json"))
    assert manifest["layout"] == 2 and manifest["memory_chunks"]["distinct_chunks"] == 6


def test_a_stored_chunk_of_the_wrong_size_is_uploaded_again(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    src = tmp_path / "img"
    sparse_image(src, 3, {0: b"a", 2: b"b"})
    index = upload_image(store, "images/x/rootfs", src, "x", PinSet())
    store.put(index.key(2), b"torn")  # e.g. left by a store that lost part of it
    upload_image(store, "images/y/rootfs", src, "y", PinSet())
    assert index.verify(2, store.get(index.key(2)))


def _serve(store: ObjectStore, tmp_path: Path) -> MemoryServer:
    cache = ChunkCache(tmp_path / "chunks", 1 << 30)
    cache.open()
    return MemoryServer(store, cache, ResolverConfig(), tmp_path / "chunks" / "objects")


def _name(store: ObjectStore, prefix: str) -> str:
    return file_name(prefix, hashlib.sha256(store.get(f"{prefix}/memory.idx")).hexdigest())


def _read_all(server: MemoryServer, name: str) -> bytes:
    size = server.fs.getattr(f"/{name}")["st_size"]
    return b"".join(server.fs.read(f"/{name}", 1 << 20, offset, 0) for offset in range(0, size, 1 << 20))


def test_chunks_a_templates_restores_cached_are_hits_for_its_snapshots(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    template = make_template(tmp_path)
    publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    snap = _snapshot_of(template, tmp_path / "snaps", "snap-1", {3: b"changed stack", 6: b"fresh"})
    publish_snapshot(store, snap, template)

    server = _serve(store, tmp_path)
    assert _read_all(server, _name(store, "templates/base/g1")) == template.memory.read_bytes()
    m = server.metrics.snapshot()
    assert m["store_gets"] == m["chunk_fetches"] == 5  # the template's 5 stored chunks

    assert _read_all(server, _name(store, "snapshots/snap-1")) == snap.memory.read_bytes()
    m = server.metrics.snapshot()
    assert m["store_gets"] == 5 + 2  # only the snapshot's own 2 chunks: its other 4 came from the cache
    assert m["cache_hits"] > 0

    restarted = _serve(store, tmp_path)  # the durable cache serves both images after a restart
    _read_all(restarted, _name(store, "snapshots/snap-1"))
    _read_all(restarted, _name(store, "templates/base/g1"))
    assert restarted.metrics.snapshot()["store_gets"] == 0


def test_republishing_a_generation_in_the_earlier_layout(tmp_path: Path) -> None:
    """A store left by an earlier version holds the generation as memory.idx (format 1) + memory.pack: the host
    that bakes it publishes it again in the current layout (never treating it as published)."""
    store = file_store(tmp_path)
    template = make_template(tmp_path)
    first = publish_template(store, template, tmp_path / "a" / "images", lambda _: None)
    manifest = json.loads(store.get("templates/base/g1/manifest.json"))
    store.put("templates/base/g1/manifest.json", json.dumps({**manifest, "layout": 1}).encode())
    store.put("templates/base/g1/memory.idx", b'CRYOIDX1{"version":1}')
    store.put("templates/base/g1/memory.pack", b"every chunk, concatenated")
    for key in _chunk_objects(store):
        store.delete(key)  # the earlier layout had none

    messages: list[str] = []
    again = publish_template(store, template, tmp_path / "a" / "images", messages.append)
    assert "again (layout 1 -> 2)" in messages[0]
    assert json.loads(store.get("templates/base/g1/manifest.json"))["layout"] == 2
    index = ChunkIndex.from_bytes(store.get("templates/base/g1/memory.idx"))
    assert again.pin("templates/base/g1/memory.idx") == first.pin("templates/base/g1/memory.idx")
    assert all(store.exists(index.key(i)) for i in range(index.chunk_count) if not index.is_zero(i))
    server = _serve(store, tmp_path)
    assert _read_all(server, _name(store, "templates/base/g1")) == template.memory.read_bytes()
