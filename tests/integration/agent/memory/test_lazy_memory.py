"""Restores whose RAM is paged on demand from the object store, through the memory server (real VMs, real FUSE).

One data dir is used across a server restart, so these tests see the host chunk cache go from empty to warm and
survive the restart; the outage tests share one host that restored the image once, and each empties its chunk
cache and breaks the store.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.memory.server.chunkcache import ChunkCache
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from cryobox.config import Paths
from tests.support.memserver import base_image, memstats
from tests.support.serve import Client

# lazy memory, no prefetch; one template and two network slots are all these tests need (cheaper start-ups)
LAZY = ["--memory", "lazy", "--no-prefetch", "--templates", "base", "--net-pool", "2"]


def assert_nothing_left(data_dir: Path, cache_dir: Path) -> None:
    """No QEMU and no memory-server mount outlives the servers that used ``data_dir``."""
    assert find_own_qemus(data_dir / "vol" / "run") == []
    mnt = Paths(data_dir, cache_dir).memserver_dir / "mnt"
    assert not mnt.is_mount(), "the memory server's mount outlived the server"


@pytest.fixture
def lazy_host(tmp_path: Path, cache_dir: Path, templates: dict[str, Template]) -> Iterator[Path]:
    """A data dir for lazy servers; checks no QEMU and no mount is left behind."""
    data_dir = tmp_path / "lazy"
    yield data_dir
    assert_nothing_left(data_dir, cache_dir)


@pytest.fixture(scope="module")
def restored_once_host(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> Path:
    """A data dir whose host has restored base lazily once, so its small objects (index) are cached, as a host
    that restored this image before an outage would have. Shared by the outage cases: none of them changes
    those objects (each empties the chunk cache itself)."""
    data_dir = tmp_path_factory.mktemp("outage")
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=LAZY) as serve:
        client = Client(serve.url, serve.api_key)
        try:
            client.create()
        finally:
            client.close()
    assert_nothing_left(data_dir, cache_dir)
    return data_dir


@pytest.fixture
def outage_host(restored_once_host: Path, cache_dir: Path) -> Iterator[Path]:
    yield restored_once_host
    assert_nothing_left(restored_once_host, cache_dir)


def test_lazy_restores_fetch_each_touched_chunk_once_and_cache_survives_restart(
    lazy_host: Path, cache_dir: Path
) -> None:
    with ServeProcess(lazy_host, cache_dir=cache_dir, prespawn=0, extra_args=LAZY) as serve:
        client = Client(serve.url, serve.api_key)
        try:
            first = client.create()
            assert client.sh(first["id"], "echo paged in") == "paged in\n"
            _only_the_image_group_opens_memory_server_files(Paths(lazy_host, cache_dir).memserver_dir / "mnt")
            stats = memstats(lazy_host, cache_dir)
            image = base_image(stats)
            m = stats["metrics"]
            # the restore touched a part of the image; each touched stored chunk was fetched exactly once
            assert 0 < image["touched_stored"] <= image["stored_chunks"] < image["chunks"]
            # exactly the chunk objects behind the stored chunks the guest read were fetched, each once (no
            # prefetch here; chunks of equal bytes are one object)
            assert 0 < image["touched_distinct"] <= image["touched_stored"]
            assert m["chunk_fetches"] == m["store_gets"] == image["touched_distinct"]
            assert m["faults"] > m["chunk_fetches"], "reads of one chunk after its fetch must not fetch again"
            assert len(_cached_chunks(lazy_host, cache_dir)) == m["chunk_fetches"]
            scrape = client.http.get("/metrics").text  # the memory server's series are part of /metrics
            assert f"chunk_fetches_total {m['chunk_fetches']}" in scrape and "faults_total" in scrape

            # fresh guest memory lives in zero chunks: served as zeros, never fetched
            zero_before, gets_before = m["zero_fills"], m["store_gets"]
            client.sh(first["id"], "python3 -c 'b = bytearray(192 << 20); b[::4096] = b\"x\" * len(b[::4096])'")
            m = memstats(lazy_host, cache_dir)["metrics"]
            assert m["zero_fills"] > zero_before
            assert m["store_gets"] - gets_before <= 8

            # a second sandbox of the same image on this host: no new GETs for what is already here (the only GETs
            # are for chunks no sandbox here had read yet: the first one keeps running and may touch one meanwhile)
            before = memstats(lazy_host, cache_dir)
            gets_before, distinct_before = before["metrics"]["store_gets"], base_image(before)["touched_distinct"]
            second = client.create()
            assert client.sh(second["id"], "echo two") == "two\n"
            after = memstats(lazy_host, cache_dir)
            new_gets = after["metrics"]["store_gets"] - gets_before
            assert new_gets == base_image(after)["touched_distinct"] - distinct_before
            assert new_gets <= 4

            # a lazily paged sandbox has no parent file on the volume: the short pause copies what it wrote, the
            # rest of its image is read from its mapping after the pause, and the whole image restores like any other
            client.sh(second["id"], "echo from-lazy > /root/mark; sync; head -c 8M /dev/urandom > /dev/shm/r")
            digest = client.sh(second["id"], "sha256sum < /dev/shm/r")
            snap = client.snapshot(second["id"])
            assert snap["pause_ms"] > 0
            manifest = json.loads((lazy_host / "vol" / "snapshots" / snap["id"] / "manifest.json").read_text())
            assert manifest["capture"]["mode"] == "devices" and manifest["memory"]["layered"] is False
            assert manifest["memory"]["own_pages"] * 4096 > 8 << 20  # the whole image: its parent's pages too
            assert client.sh(second["id"], "cat /root/mark") == "from-lazy\n"
            restored = client.create(from_snapshot=snap["id"])
            assert client.sh(restored["id"], "cat /root/mark") == "from-lazy\n"
            assert client.sh(restored["id"], "sha256sum < /dev/shm/r") == digest
        finally:
            client.close()

    # restart: the durable chunk cache answers; the store sees no GET at all
    with ServeProcess(lazy_host, cache_dir=cache_dir, prespawn=0, extra_args=LAZY) as serve:
        client = Client(serve.url, serve.api_key)
        try:
            again = client.create()
            assert client.sh(again["id"], "echo warm") == "warm\n"
            m = memstats(lazy_host, cache_dir)["metrics"]
            assert m["store_gets"] == 0
            assert m["cache_hits"] > 0
        finally:
            client.close()


def _open_as(mnt_fd: int, name: str, groups: list[int]) -> str:
    """Open ``name`` under the mount as uid/gid 65534 with ``groups``; '' or the error's name."""
    code = "import os, sys\ntry: os.open(sys.argv[2], os.O_RDONLY, dir_fd=int(sys.argv[1]))\n"
    code += "except OSError as e: print(type(e).__name__)"
    result = subprocess.run(
        ["/usr/bin/python3", "-c", code, str(mnt_fd), name],  # the venv's is under /root (0700)
        user=65534,
        group=65534,
        extra_groups=groups,
        pass_fds=(mnt_fd,),
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def _only_the_image_group_opens_memory_server_files(mnt: Path) -> None:
    """The mount admits other uids (jailed QEMUs) but the kernel checks modes: root:image_gid, 0660."""
    options = next(
        line.split()[3] for line in Path("/proc/mounts").read_text().splitlines() if line.split()[1] == str(mnt)
    )
    assert "default_permissions" in options.split(",") and "allow_other" in options.split(","), options
    (image,) = [p for p in mnt.iterdir() if p.name.startswith("templates+base+")]
    info = image.stat()
    assert info.st_uid == 0 and info.st_gid != 0 and stat.S_IMODE(info.st_mode) == 0o660
    fd = os.open(mnt, os.O_PATH | os.O_DIRECTORY)
    try:
        assert _open_as(fd, image.name, []) == "PermissionError"  # another user of the host
        assert _open_as(fd, image.name, [info.st_gid]) == ""  # a jailed QEMU (in the image group)
    finally:
        os.close(fd)


def _cached_chunks(data_dir: Path, cache_dir: Path) -> list[str]:
    cache = ChunkCache(Paths(data_dir, cache_dir).chunk_cache_dir, 1 << 40)
    cache.open()
    return cache.digests()


@pytest.mark.parametrize("fault", ["fail_rate=1", "throttle_rate=1"])
def test_store_outage_fails_restore_loudly_and_quickly(outage_host: Path, cache_dir: Path, fault: str) -> None:
    lazy_host = outage_host  # its small objects (index) are cached: only chunk fetches meet the outage
    chunks = Paths(lazy_host, cache_dir).chunk_cache_dir
    for entry in chunks.iterdir():
        if entry.name != "objects":
            shutil.rmtree(entry)

    deadline_s = 1.0  # retries with backoff fit in it; the restore must fail soon after
    args = [*LAZY, "--store-faults", fault, "--fetch-deadline", str(deadline_s)]
    with ServeProcess(lazy_host, cache_dir=cache_dir, prespawn=0, extra_args=args) as serve:
        client = Client(serve.url, serve.api_key)
        try:
            started = time.monotonic()
            error = client.call("POST", "/v1/sandboxes", 502, json={"template": "base"})
            elapsed = time.monotonic() - started
            assert error["code"] == "chunk_fetch_failed", error
            assert "chunk" in error["error"] and "templates/base/" in error["error"], error
            assert elapsed < deadline_s + 10, f"a failing store must fail the restore in bounded time ({elapsed:.1f}s)"
            assert client.call("GET", "/v1/sandboxes")["items"] == []
            assert find_own_qemus(lazy_host / "vol" / "run") == [], "the failed restore's QEMU must be gone"
            m = memstats(lazy_host, cache_dir)["metrics"]
            assert m["fetch_failures"] >= 1
        finally:
            client.close()
