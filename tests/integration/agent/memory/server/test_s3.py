"""The memory server process against a real S3-protocol server: the FUSE file's bytes, single-flight across
concurrent page faults, zero chunks without GETs, the cache budget, and a restart that keeps the cache."""

from __future__ import annotations

import asyncio
import hashlib
import mmap
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.memory.client import MemoryServerProcess, MemServerConfig
from cryobox.agent.memory.server.fusefs import file_name
from cryobox.agent.publish.templates import upload_image
from cryobox.objstore.chunkfmt import CHUNK_SIZE
from cryobox.objstore.client import ObjectStore
from cryobox.objstore.pins import PinSet
from tests.support.s3 import CREDENTIALS, MotoServer, moto_server

CHUNKS = 12
ZERO = {1, 4, 5, 9}  # chunks left as holes (zero chunks: never stored, never fetched)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_server() as server:
        yield server


@pytest.fixture
def image(tmp_path: Path, moto: MotoServer) -> tuple[ObjectStore, str, Path, str]:
    """A 48 MiB sparse image with random data in 8 of its 12 chunks, uploaded to a fresh bucket; and its file
    name on the memory server's mount (its index pin included)."""
    bucket = moto.create_bucket()
    store = moto.open(bucket)
    raw = tmp_path / "image.raw"
    with open(raw, "wb") as fh:
        fh.truncate(CHUNKS * CHUNK_SIZE)
        for i in range(CHUNKS):
            if i not in ZERO:
                fh.seek(i * CHUNK_SIZE)
                fh.write(os.urandom(CHUNK_SIZE))
    pins = PinSet()
    upload_image(store, "templates/t/g1/memory", raw, "g1", pins)
    return store, moto.url(bucket), raw, file_name("templates/t/g1", pins.pin("templates/t/g1/memory.idx").sha256)


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():  # the memory server process inherits them
        monkeypatch.setenv(name, value)


def start(tmp_path: Path, url: str, budget: int = 1 << 30) -> MemoryServerProcess:
    config = MemServerConfig(tmp_path / "ms", url, tmp_path / "chunks", budget)
    server = MemoryServerProcess(config)
    server.start()
    return server


def stats(server: MemoryServerProcess) -> dict[str, Any]:
    return asyncio.run(server.stats())


def test_fuse_file_is_the_image_and_concurrent_faults_fetch_each_chunk_once(
    tmp_path: Path, image: tuple[ObjectStore, str, Path, str]
) -> None:
    _, url, raw, name = image
    server = start(tmp_path, url)
    try:
        path = server.path_for(name)
        assert path.stat().st_size == CHUNKS * CHUNK_SIZE
        with open(path, "rb") as fh:
            mapping = mmap.mmap(fh.fileno(), 0, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            # 16 threads fault pages of chunk 2 (missing) at the same moment
            barrier = threading.Barrier(16)
            seen: list[int] = []

            def fault(i: int) -> None:
                barrier.wait()
                # pages 128 KiB apart in the first half of the chunk: the kernel's read-around of each fault
                # (up to 1 MiB) overlaps the others but never reaches chunk 3
                offset = 2 * CHUNK_SIZE + CHUNK_SIZE // 16 + i * (CHUNK_SIZE // 32)
                seen.append(mapping[offset])

            threads = [threading.Thread(target=fault, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            first = stats(server)["metrics"]
            assert first["store_gets"] == 1 and first["chunk_fetches"] == 1
            assert first["faults"] >= 1

            # the whole file equals the image; zero chunks cost no GET
            digest = hashlib.sha256(mapping[:]).hexdigest()
            assert digest == hashlib.sha256(raw.read_bytes()).hexdigest()
            m = stats(server)["metrics"]
            assert m["store_gets"] == CHUNKS - len(ZERO)
            assert m["zero_fills"] >= len(ZERO)
            mapping[0] = 1  # MAP_PRIVATE: a write copies the page, the image is untouched
        finally:
            mapping.close()
    finally:
        server.stop()
    assert not server.config.mount.is_mount()

    # a new server over the same cache: the chunks are there, no GET (index and chunks are local) -- except for
    # one chunk whose cached bytes rotted on disk: detected by its sha256, evicted and fetched again
    with open(raw, "rb") as fh:
        digest = hashlib.sha256(os.pread(fh.fileno(), CHUNK_SIZE, 3 * CHUNK_SIZE)).hexdigest()
    rotten = tmp_path / "chunks" / digest[:2] / digest  # chunk 3, cached by its sha256
    with open(rotten, "r+b") as bad:
        bad.seek(12345)
        byte = bad.read(1)
        bad.seek(12345)
        bad.write(bytes([byte[0] ^ 0xFF]))
    again = start(tmp_path, url)
    try:
        with open(again.path_for(name), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == hashlib.sha256(raw.read_bytes()).hexdigest()
        after = stats(again)
        assert after["metrics"]["store_gets"] == 1
        assert after["cache"]["corrupt"] >= 1  # concurrent reads may both have seen the bad file
        assert after["metrics"]["cache_hits"] >= CHUNKS - len(ZERO) - 1
    finally:
        again.stop()


def test_cache_budget_is_respected_by_the_server(tmp_path: Path, image: tuple[ObjectStore, str, Path, str]) -> None:
    _, url, raw, name = image
    budget = 3 * CHUNK_SIZE
    server = start(tmp_path, url, budget=budget)
    try:
        with open(server.path_for(name), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == hashlib.sha256(raw.read_bytes()).hexdigest()
        cache = stats(server)["cache"]
        assert cache["used_bytes"] <= budget
        assert cache["evictions"] >= CHUNKS - len(ZERO) - 3
    finally:
        server.stop()
