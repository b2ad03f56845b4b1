"""The pure helpers of capture: finding QEMU's RAM mapping in /proc/<pid>/maps and pre-faulting it. The test
process stands in for QEMU: it maps a file with ``mmap`` and looks itself up."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cryobox.agent.vm.migration import _continue_when_saved, _ensure_running, prepopulate, ram_mapping
from cryobox.errors import VmmError

SIZE = 64 * mmap.PAGESIZE


@contextmanager
def mapped(path: Path, size: int = SIZE) -> Iterator[int]:
    """Map ``path`` (written full of data) MAP_PRIVATE like a restored VM's RAM; yields its address."""
    path.write_bytes(bytes(range(256)) * (size // 256))
    with path.open("rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        pointer = ctypes.c_char.from_buffer(m)
        address = ctypes.addressof(pointer)
        del pointer  # releases the buffer export, so that the mapping can be closed
        yield address
    finally:
        m.close()


def rss_kib(address: int) -> int:
    """Resident size of the mapping starting at ``address`` (from /proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            inside = int(head.split("-")[0], 16) == address
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping at {address:#x}")


def test_ram_mapping_finds_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    with mapped(path) as address:
        lo, hi = ram_mapping(os.getpid(), path)
        assert lo == address
        assert hi - lo == SIZE


def test_ram_mapping_path_with_spaces(tmp_path: Path) -> None:
    path = tmp_path / "a dir" / "guest  memory"
    path.parent.mkdir()
    with mapped(path) as address:
        assert ram_mapping(os.getpid(), path) == (address, address + SIZE)


def test_ram_mapping_is_exact_about_the_path(tmp_path: Path) -> None:
    with mapped(tmp_path / "memory2"):
        with pytest.raises(VmmError, match="has no mapping of"):
            ram_mapping(os.getpid(), tmp_path / "memory")


def test_ram_mapping_not_mapped(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    path.write_bytes(bytes(SIZE))
    with pytest.raises(VmmError, match=f"QEMU {os.getpid()} has no mapping of {path}"):
        ram_mapping(os.getpid(), path)
    with mapped(path):
        ram_mapping(os.getpid(), path)
    with pytest.raises(VmmError):  # unmapped again
        ram_mapping(os.getpid(), path)


def test_prepopulate_faults_the_mapping_in(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    with mapped(path) as address:
        before = rss_kib(address)
        prepopulate(os.getpid(), path, chunk=5 * mmap.PAGESIZE)  # a chunk that does not divide the size
        assert before < SIZE // 1024  # nothing touched it yet
        assert rss_kib(address) == SIZE // 1024
        # read-only: the mapping (and the file) are unchanged
        assert ctypes.string_at(address, 512) == bytes(range(256)) * 2
    assert path.read_bytes() == bytes(range(256)) * (SIZE // 256)


def test_prepopulate_without_mapping(tmp_path: Path) -> None:
    with pytest.raises(VmmError):
        prepopulate(os.getpid(), tmp_path / "memory")


class _FakeVm:
    """Answers QMP like a QEMU 10 background snapshot: ``query-migrate`` shows no page saved for the first polls."""

    def __init__(self, saved_after: int, running_after_cont: bool = True) -> None:
        self.polls = 0
        self.saved_after = saved_after
        self.running_after_cont = running_after_cont
        self.commands: list[str] = []

    async def execute(self, command: str, args: object = None) -> dict[str, object]:
        self.commands.append(command)
        if command == "query-migrate":
            self.polls += 1
            saved = self.polls > self.saved_after
            return {"status": "active", "ram": {"normal": 3 if saved else 0, "duplicate": 0}}
        if command == "query-status":
            running = self.running_after_cont or self.commands.count("cont") > 1
            return {"running": running, "status": "running" if running else "paused"}
        return {}


def test_continue_when_saved_waits_for_the_first_page() -> None:
    vm = _FakeVm(saved_after=3)
    asyncio.run(_continue_when_saved(vm, timeout=5))  # type: ignore[arg-type]
    assert vm.commands == ["query-migrate"] * 4 + ["cont"]


def test_continue_when_saved_leaves_a_failed_migration_alone() -> None:
    class Failed(_FakeVm):
        async def execute(self, command: str, args: object = None) -> dict[str, object]:
            self.commands.append(command)
            return {"status": "failed"}

    vm = Failed(saved_after=0)
    asyncio.run(_continue_when_saved(vm, timeout=5))  # type: ignore[arg-type]
    assert vm.commands == ["query-migrate"]


def test_ensure_running_continues_a_vm_left_paused() -> None:
    vm = _FakeVm(saved_after=0, running_after_cont=False)
    asyncio.run(_ensure_running(vm))  # type: ignore[arg-type]
    assert vm.commands == ["query-status", "cont"]
    vm = _FakeVm(saved_after=0)
    asyncio.run(_ensure_running(vm))  # type: ignore[arg-type]
    assert vm.commands == ["query-status"]
