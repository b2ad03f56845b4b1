"""A chunk-fetch failure is dated: the memory server's ``/failure`` answers only for failures since a VM started,
a later successful fetch clears it, and ``MemorySource.explain`` asks with the VM's start time."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.memory.client import MemoryServerProcess, MemServerConfig
from cryobox.agent.memory.hot import HotImages
from cryobox.agent.memory.server.fusefs import file_name
from cryobox.agent.memory.server.main import MemoryServer, _handler, _UnixHTTPServer
from cryobox.agent.memory.server.resolver import ResolverConfig
from cryobox.agent.memory.settings import MemoryMode
from cryobox.agent.sandbox.memsource import MemorySource, vm_started_at
from cryobox.agent.vm import Accel, MachineConfig, MemoryBacking, MicroVM, VmPaths
from cryobox.errors import ChunkFetchFailed, CryoboxError, IntegrityError
from cryobox.objstore.chunkfmt import ChunkIndex, chunk_key
from cryobox.objstore.client import ObjectStore, open_store
from tests.support.clock import FakeClock

CS = 64
PREFIX = "templates/base/g1"
MACHINE = MachineConfig(
    memory_mib=16, cpus=1, accel=Accel.TCG, kernel=Path("/k"), initrd=Path("/i"), tsc_khz=1, norandmaps=True
)


def publish(store: ObjectStore, chunks: list[bytes]) -> tuple[str, dict[str, bytes]]:
    """Store the image; returns its file name (its index pinned) and its chunk objects."""
    sha = tuple(hashlib.sha256(c).hexdigest() for c in chunks)
    index = ChunkIndex(CS * len(chunks), CS, "g1", bytes((len(chunks) + 7) // 8), sha)
    objects = {chunk_key(digest): chunk for digest, chunk in zip(sha, chunks, strict=True)}
    for key, chunk in objects.items():
        store.put(key, chunk)
    store.put(f"{PREFIX}/memory.idx", index.to_bytes())
    return file_name(PREFIX, hashlib.sha256(index.to_bytes()).hexdigest()), objects


def unpublish(store: ObjectStore, objects: dict[str, bytes]) -> None:
    """The image's chunk objects vanish from the store (an outage of every GET of them)."""
    for key in objects:
        store.delete(key)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[MemoryServer, MemoryServerProcess, FakeClock]]:
    """A memory server's control socket (no FUSE mount) and the agent's client for it."""
    stamp = FakeClock(0.0)
    server = MemoryServer(open_store("memory://"), None, ResolverConfig(retries=0), stamp=stamp)
    client = MemoryServerProcess(MemServerConfig(tmp_path / "ms", "memory://", tmp_path / "chunks", 1 << 30))
    client.config.root.mkdir()
    control = _UnixHTTPServer(str(client.config.control), _handler(server))
    thread = threading.Thread(target=control.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, client, stamp
    finally:
        control.shutdown()
        control.server_close()
        thread.join(5)
        asyncio.run(client._client.aclose())


def test_failure_endpoint_is_dated_and_cleared_by_a_later_success(
    served: tuple[MemoryServer, MemoryServerProcess, FakeClock],
) -> None:
    server, client, stamp = served
    chunks = [bytes([1 + i]) * CS for i in range(3)]
    name, objects = publish(server.store, chunks)
    ref = server.table.get(name)
    unpublish(server.store, objects)
    stamp.now = 100.0
    with pytest.raises(ChunkFetchFailed):
        server.resolver.read(ref, 0, 8)

    async def ask(since: float | None) -> CryoboxError | None:
        return await client.failure(name, since)

    recorded = asyncio.run(ask(None))
    assert isinstance(recorded, ChunkFetchFailed) and "chunk 0" in recorded.message
    assert isinstance(asyncio.run(ask(99.5)), ChunkFetchFailed)  # a VM that started before the failure
    assert asyncio.run(ask(100.5)) is None  # a VM spawned after it did not die of it

    for key, chunk in objects.items():  # the store answers again
        server.store.put(key, chunk)
    stamp.now = 200.0
    assert server.resolver.read(ref, 2 * CS, 8) == chunks[2][:8]
    assert asyncio.run(ask(None)) is None
    assert asyncio.run(ask(0.0)) is None


def test_explain_asks_only_for_failures_since_the_vm_started(
    served: tuple[MemoryServer, MemoryServerProcess, FakeClock], tmp_path: Path
) -> None:
    server, client, stamp = served
    name, objects = publish(server.store, [bytes([7]) * CS])
    ref = server.table.get(name)
    unpublish(server.store, objects)
    stamp.now = 100.0
    with pytest.raises(ChunkFetchFailed):
        server.resolver.read(ref, 0, 8)

    vm = MicroVM(
        "vm1",
        MACHINE,
        VmPaths(tmp_path / "run" / "vm1"),
        MemoryBacking(client.path_for(name), share=False, write_trackable=False),
        tmp_path / "disk.qcow2",
    )
    started = {"at": 150.0}
    source = MemorySource(HotImages(tmp_path / "hot"), client, MemoryMode.LAZY, False, lambda _vm: started["at"])
    assert asyncio.run(source.explain(vm)) is None  # the outage was over before this VM existed
    started["at"] = 90.0
    assert isinstance(asyncio.run(source.explain(vm)), ChunkFetchFailed)


def test_a_swapped_index_is_explained_as_a_store_integrity_failure(
    served: tuple[MemoryServer, MemoryServerProcess, FakeClock],
) -> None:
    server, client, stamp = served
    name, _ = publish(server.store, [bytes([7]) * CS])
    publish(server.store, [bytes([8]) * CS])  # a consistent index (and its chunks) swapped in
    stamp.now = 100.0
    with pytest.raises(IntegrityError):
        server.table.get(name)
    recorded = asyncio.run(client.failure(name, 99.0))
    assert isinstance(recorded, IntegrityError) and recorded.code == "store_integrity"
    assert recorded.details["key"] == f"{PREFIX}/memory.idx"


def test_vm_start_time_from_proc_or_pidfile(tmp_path: Path) -> None:
    paths = VmPaths(tmp_path / "run" / "vm1")
    paths.root.mkdir(parents=True)
    vm = MicroVM("vm1", MACHINE, paths, MemoryBacking(tmp_path / "m", share=False), tmp_path / "disk.qcow2")
    proc = tmp_path / "proc"
    proc.mkdir()
    assert vm_started_at(vm, proc) is None  # never started, no pidfile

    paths.pidfile.write_text("4242\n")
    os.utime(paths.pidfile, (1_000_000.0, 1_000_000.0))
    at = vm_started_at(vm, proc, boot_clock=lambda: 5000.0, wall_clock=lambda: 1_000_030.0)
    assert at == pytest.approx(4970.0)  # written 30 s ago by the wall clock = 30 s ago since boot


def test_vm_start_time_of_a_live_process_comes_from_its_stat(tmp_path: Path) -> None:
    paths = VmPaths(tmp_path / "run" / "vm1")
    pid = os.getpid()
    vm = RunningVM(pid, "vm1", MACHINE, paths, MemoryBacking(tmp_path / "m", share=False), tmp_path / "disk.qcow2")
    tick = os.sysconf("SC_CLK_TCK")
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    rest = ["S"] + ["0"] * 18 + [str(123 * tick)] + ["0"] * 10
    (proc / str(pid) / "stat").write_text(f"{pid} (qemu sys (x)) {' '.join(rest)}\n")
    (proc / str(pid) / "cmdline").write_bytes(b"qemu-system-x86_64\0-pidfile\0" + str(paths.pidfile).encode() + b"\0")
    assert vm_started_at(vm, proc) == pytest.approx(123.0)
    (proc / str(pid) / "cmdline").write_bytes(b"bash\0")  # the pid now belongs to someone else: not trusted
    assert vm_started_at(vm, proc) is None


class RunningVM(MicroVM):
    """A VM whose QEMU has the given pid (nothing is started)."""

    def __init__(self, pid: int, *args: Any) -> None:
        super().__init__(*args)
        self._fake_pid = pid

    @property
    def pid(self) -> int | None:
        return self._fake_pid
