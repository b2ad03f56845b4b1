"""The memory server checks every chunk index it loads against the pin its file name carries, before parsing it.

A file:// store, no FUSE mount: :class:`MemoryFS` operations are called directly. A consistent ``memory.idx``
swapped in with its chunk objects (every chunk matches the swapped index, so per-chunk checks alone accept it) is
refused with ``EIO``, recorded as a ``store_integrity`` failure and not kept; a name without a pin is refused
before any GET; an index of the earlier format is refused saying so.
"""

from __future__ import annotations

import errno
import hashlib
import logging
from pathlib import Path

import mfusepy as fuse
import pytest

from cryobox.agent.memory.client import MemServerConfig
from cryobox.agent.memory.server.chunkcache import ChunkCache
from cryobox.agent.memory.server.fusefs import MemoryFS, file_name, parse_name, prefix_of
from cryobox.agent.memory.server.main import MemoryServer, parse_args
from cryobox.agent.memory.server.resolver import ResolverConfig
from cryobox.agent.publish.templates import upload_image
from cryobox.errors import IntegrityError
from cryobox.objstore.chunkfmt import CHUNK_SIZE, ChunkIndex
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.pins import PinSet
from tests.support.images import sparse_image

PREFIX = "templates/base/g1"
IDX = f"{PREFIX}/memory.idx"
GENUINE = b"genuine guest ram"
EVIL = b"attacker's guest ram"


def _publish(store: ObjectStore, tmp_path: Path, page: bytes, tag: str) -> str:
    """Upload a 2-chunk image with ``page`` in its second chunk under PREFIX; returns its index's sha256."""
    src = tmp_path / f"{tag}.img"
    sparse_image(src, 2, {1: page})
    pins = PinSet()
    upload_image(store, f"{PREFIX}/memory", src, "g1", pins)
    return pins.pin(IDX).sha256


def _fs(store: ObjectStore, tmp_path: Path) -> MemoryFS:
    """A freshly started memory server's filesystem (its kept objects under ``tmp_path/chunks/objects``)."""
    cache = ChunkCache(tmp_path / "chunks", 1 << 30)
    cache.open()
    return MemoryServer(store, cache, ResolverConfig(retries=0), tmp_path / "chunks" / "objects").fs


def _eio(fs: MemoryFS, name: str) -> None:
    for call in (lambda: fs.getattr(f"/{name}"), lambda: fs.open(f"/{name}", 0)):
        with pytest.raises(fuse.FuseOSError) as info:
            call()
        assert info.value.errno == errno.EIO


def _kept(tmp_path: Path) -> list[Path]:
    objects = tmp_path / "chunks" / "objects"
    return sorted(objects.iterdir()) if objects.exists() else []


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


def test_the_genuine_index_loads_is_kept_and_serves_its_chunks(store: ObjectStore, tmp_path: Path) -> None:
    sha = _publish(store, tmp_path, GENUINE, "genuine")
    name = file_name(PREFIX, sha)
    fs = _fs(store, tmp_path)
    assert fs.getattr(f"/{name}")["st_size"] == 2 * CHUNK_SIZE
    assert fs.open(f"/{name}", 0) == 0
    assert fs.read(f"/{name}", len(GENUINE), CHUNK_SIZE + 100, 0) == GENUINE
    assert fs.readdir("/", 0) == [".", "..", name]
    [kept] = _kept(tmp_path)
    assert kept.read_bytes() == store.get(IDX)

    store.delete(IDX)  # a restarted server reads the kept (and re-checked) copy: no GET
    gets = store.stats.gets
    assert _fs(store, tmp_path).getattr(f"/{name}")["st_size"] == 2 * CHUNK_SIZE
    assert store.stats.gets == gets


def test_a_swapped_consistent_index_and_pack_are_refused_and_not_kept(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = file_name(PREFIX, _publish(store, tmp_path, GENUINE, "genuine"))
    evil_sha = _publish(store, tmp_path, EVIL, "evil")  # index and pack replaced together: consistent
    ChunkIndex.from_bytes(store.get(IDX))  # a well-formed index

    fs = _fs(store, tmp_path)
    with caplog.at_level(logging.ERROR, logger="cryobox.agent.memory.server.fusefs"):
        _eio(fs, name)
    assert "store_integrity" in caplog.text and IDX in caplog.text
    failure = fs.table.failure(name)
    assert isinstance(failure, IntegrityError) and failure.code == "store_integrity"
    assert failure.details["key"] == IDX and failure.details["expected"] == {"sha256": parse_name(name)[1]}
    assert fs.table.loaded() == {} and fs.readdir("/", 0) == [".", ".."]
    assert _kept(tmp_path) == [], "nothing from the swapped pair is kept"

    # only the pin stops it: named by the swapped index's own hash, the attacker's RAM would be served
    evil = file_name(PREFIX, evil_sha)
    assert fs.read(f"/{evil}", len(EVIL), CHUNK_SIZE + 100, 0) == EVIL


def test_a_kept_index_that_does_not_match_its_pin_is_fetched_again(store: ObjectStore, tmp_path: Path) -> None:
    sha = _publish(store, tmp_path, GENUINE, "genuine")
    genuine_idx = store.get(IDX)
    name = file_name(PREFIX, sha)
    _fs(store, tmp_path).getattr(f"/{name}")
    [kept] = _kept(tmp_path)
    _publish(store, tmp_path, EVIL, "evil")
    kept.write_bytes(store.get(IDX))  # e.g. kept by a server that checked no pins
    store.put(IDX, genuine_idx)  # the store is sound again (the swapped chunks are there too)

    fs = _fs(store, tmp_path)
    assert fs.getattr(f"/{name}")["st_size"] == 2 * CHUNK_SIZE
    assert kept.read_bytes() == genuine_idx, "the bad copy was replaced by the verified one"

    _publish(store, tmp_path, EVIL, "evil")
    kept.write_bytes(store.get(IDX))
    _eio(_fs(store, tmp_path), name)  # kept copy and store both swapped: refused, and the bad copy removed
    assert _kept(tmp_path) == []


@pytest.mark.parametrize("suffix", ["", "@", "@" + "AB" * 32, "@" + "0" * 63, "@xyz"])
def test_a_name_without_a_valid_pin_is_refused_before_any_get(store: ObjectStore, tmp_path: Path, suffix: str) -> None:
    _publish(store, tmp_path, GENUINE, "genuine")
    name = "templates+base+g1" + suffix
    fs = _fs(store, tmp_path)
    gets = store.stats.gets
    _eio(fs, name)
    assert store.stats.gets == gets, "nothing was fetched for it"
    failure = fs.table.failure(name)
    assert isinstance(failure, IntegrityError) and "names no pin" in failure.message
    assert fs.table.loaded() == {} and _kept(tmp_path) == []


def test_prefetch_of_a_swapped_image_is_refused_too(store: ObjectStore, tmp_path: Path) -> None:
    name = file_name(PREFIX, _publish(store, tmp_path, GENUINE, "genuine"))
    _publish(store, tmp_path, EVIL, "evil")
    server = MemoryServer(store, None, ResolverConfig(retries=0))
    with pytest.raises(IntegrityError):
        server.prefetch(name)


def test_file_names_carry_the_pin() -> None:
    sha = hashlib.sha256(b"index").hexdigest()
    name = file_name(PREFIX, sha)
    assert name == f"templates+base+g1@{sha}" and len(name) < 255
    assert parse_name(name) == (PREFIX, sha) and prefix_of(name) == PREFIX
    assert parse_name("templates+base+g1") == (PREFIX, None)
    for prefix, pin in (("templates/a@b/g1", sha), ("templates/a+b", sha), ("", sha), (PREFIX, "0" * 63)):
        with pytest.raises(ValueError):
            file_name(prefix, pin)


def test_the_server_argv_names_the_pinned_naming(tmp_path: Path) -> None:
    argv = MemServerConfig(tmp_path / "ms", "memory://", tmp_path / "chunks", 1 << 30).argv()
    assert parse_args(argv[3:]).pinned_names and parse_args(argv[3:]).content_chunks
    for older in ("--pinned-names", "--content-chunks"):  # an older agent's argv: not served
        with pytest.raises(SystemExit):
            parse_args([a for a in argv[3:] if a != older])


def test_an_index_of_the_earlier_format_is_refused_saying_so(store: ObjectStore, tmp_path: Path) -> None:
    """A template left in a store by an earlier version (one memory.pack per image): its pinned index loads,
    and is refused as format 1, with EIO; nothing is served from a pack."""
    legacy = b'CRYOIDX1{"version":1,"image_size":8,"chunk_size":8,"generation":"g1","zero":"AA==",'
    legacy += b'"sha256":["' + hashlib.sha256(b"ram!ram!").hexdigest().encode() + b'"],"offsets":[0]}'
    store.put(IDX, legacy)
    store.put(f"{PREFIX}/memory.pack", b"ram!ram!")
    name = file_name(PREFIX, hashlib.sha256(legacy).hexdigest())
    fs = _fs(store, tmp_path)
    _eio(fs, name)
    failure = fs.table.failure(name)
    assert failure is not None and failure.code == "store_error" and "format 1" in failure.message
