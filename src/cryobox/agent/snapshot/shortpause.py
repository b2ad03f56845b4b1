"""The short-pause snapshot of a restored VM over its parent image (:mod:`.devstate`), as a memory layer.

The parent image is cloned (a reflink on the volume), the capture copies the pages the guest wrote into the
clone inside its pause, and the layer's accounting runs afterwards while the guest goes on: a written page whose
bytes equal the parent's stays shared, a zeroed one becomes a hole, the others are the layer's own pages (the
manifest's ``own_pages``, ``unchanged_written_pages`` and content digest, as for a streamed layer). The vmstate
is the device state behind the configuration section of the vmstate the VM was restored from.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import VmmError
from ...util.files import punch_hole
from ..vm import MicroVM
from ..vm.migration import CaptureReport
from ..vm.states import VmState
from ..vm.vmstream import SplitStats, devices_vmstate
from .devstate import Staged, WrittenPagesCopy, capture_written, ms_since, saves_devices
from .memlayer import AllWritten, LayerImage, ParentImage, Run, account_runs, chain_digest, clone_parent
from .staging import StagingPool

PAGE_SIZE = 4096
ZERO_PAGE = bytes(PAGE_SIZE)
COPY_CHUNK = 4 << 20

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Split:
    """What a capture left in its directory, for the manifest."""

    stats: SplitStats
    memory: dict[str, Any]
    """The manifest's ``memory`` facts about the layer (``layered``, ``parent``, ``digest``, ``own_pages``,
    ``unchanged_written_pages``)."""


async def saves_written(vm: MicroVM) -> bool:
    """A running VM this process restored, on a QEMU with ``xen-save-devices-state``: the short-pause capture."""
    return vm.state is VmState.RUNNING and vm.state_prefix is not None and await saves_devices(vm)


async def capture_layer(
    vm: MicroVM,
    work: Path,
    ram_bytes: int,
    parent: ParentImage,
    capture_disk: Callable[[], Awaitable[None]],
    pool: StagingPool | None = None,
) -> CaptureReport[Split] | None:
    """The short-pause capture (:mod:`.devstate`): the device state and the pages ``vm`` wrote, into a
    clone of ``parent``; ``None`` when the parent cannot be cloned (the caller streams instead)."""
    tmp = work / ".memory.tmp"
    try:
        await asyncio.to_thread(clone_parent, parent, tmp, ram_bytes)
    except VmmError as err:
        log.warning("snapshot of %s streams all RAM: %s", vm.vm_id, err.message)
        return None
    assert vm.state_prefix is not None
    devices = work / ".devices"
    fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
    parent_fd = os.open(parent.path, os.O_RDONLY | os.O_CLOEXEC)
    counts: list[tuple[int, int]] = []
    settled: dict[str, float] = {}
    found: dict[str, int] = {}
    hashed: list[Run] = []
    try:
        sink = LayerImage(fd, parent_fd, AllWritten(), parent.digest)

        def settle(buffer: mmap.mmap, staged: Staged) -> None:
            from .layersettle import settle_staged  # numpy: not imported before a snapshot needs it

            with open(_compare_source(vm, parent, ram_bytes), "rb", buffering=0) as old:
                pages, zeros, runs = settle_staged(sink, tmp, buffer, staged.pending, old.fileno(), settled, found)
            counts.append((pages, zeros))
            hashed.extend(runs)
            if staged.direct:  # pages past the staging buffer, already in the file: accounted from there
                counts.append(account_runs(sink, staged.direct))

        report = await capture_written(vm, fd, devices, capture_disk, settle, pool)
        started = time.monotonic()
        # every changed page came through the buffer: its runs are hashed; else read them back from the file
        single = not report.result.direct
        digest = chain_digest(parent.digest, hashed) if single else await asyncio.to_thread(sink.digest)
        report.steps_ms["digest"] = ms_since(started)
    finally:
        os.close(fd)
        os.close(parent_fd)
    pages, zeros = sum(p for p, _ in counts), sum(z for _, z in counts)
    report.steps_ms.update({f"settle.{name}": ms for name, ms in settled.items()})
    report.counts.update(found)
    memory: dict[str, Any] = {
        "layered": True,
        "parent": {"key": parent.key, "digest": parent.digest},
        "digest": digest,
        "own_pages": sink.own_pages,
        "unchanged_written_pages": sink.same_pages,
    }
    return await _settle(vm, work, tmp, report, (pages, zeros, ram_bytes), memory)


def _compare_source(vm: MicroVM, parent: ParentImage, size: int) -> Path:
    """The parent's bytes to compare written pages with: the tmpfs copy the VM maps (resident, the same bytes)
    where it is whole, else the parent image on the volume."""
    try:
        if vm.memory.path.stat().st_size == size:
            return vm.memory.path
    except OSError:
        pass
    return parent.path


async def capture_whole(
    vm: MicroVM,
    work: Path,
    ram_bytes: int,
    capture_disk: Callable[[], Awaitable[None]],
    pool: StagingPool | None = None,
) -> CaptureReport[Split]:
    """The same short pause for a VM whose parent is only behind its mapping (lazily paged from the memory
    server): the pages it wrote are copied in the pause; after it, every page it never wrote is read from the
    mapping's file (the parent's bytes: they never change) into a whole image (its digest comes in ``finish``)."""
    assert vm.state_prefix is not None
    tmp = work / ".memory.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, ram_bytes)
        report = await capture_written(vm, fd, work / ".devices", capture_disk, pool=pool)
        pages, zeros = await asyncio.to_thread(fill_unwritten, fd, vm.memory.path, report.result.runs, ram_bytes)
    finally:
        os.close(fd)
    memory: dict[str, Any] = {
        "layered": False,
        "parent": None,
        "digest": None,
        "own_pages": pages,
        "unchanged_written_pages": 0,
    }
    return await _settle(vm, work, tmp, report, (pages, zeros, ram_bytes), memory)


async def _settle(
    vm: MicroVM,
    work: Path,
    tmp: Path,
    report: CaptureReport[WrittenPagesCopy],
    counts: tuple[int, int, int],
    memory: dict[str, Any],
) -> CaptureReport[Split]:
    """The vmstate (device state behind the VM's configuration section) and ``memory`` in place."""
    assert vm.state_prefix is not None
    devices = work / ".devices"
    vmstate = devices_vmstate(vm.state_prefix, await asyncio.to_thread(devices.read_bytes))
    await asyncio.to_thread((work / "vmstate").write_bytes, vmstate)
    devices.unlink()
    os.replace(tmp, work / "memory")
    pages, zeros, ram_bytes = counts
    stats = SplitStats(pages=pages, zero_pages=zeros, vmstate_bytes=len(vmstate), blocks={"ram": ram_bytes})
    return CaptureReport(
        mode=report.mode,
        pause_ms=report.pause_ms,
        total_ms=report.total_ms,
        qemu_downtime_ms=report.qemu_downtime_ms,
        prepopulate_ms=report.prepopulate_ms,
        result=Split(stats, memory),
        phases_ms=report.phases_ms,
        steps_ms=report.steps_ms,
        counts=report.counts,
    )


def fill_unwritten(fd: int, source: Path, runs: list[tuple[int, int]], size: int) -> tuple[int, int]:
    """Make ``fd`` (sparse, ``size`` bytes, the written ``runs`` already in it) a whole image: every other range
    read from ``source``; zero pages stay (or become) holes. Returns ``(data pages, zero pages)``."""
    pages = zeros = 0
    edges = [0]
    for offset, length in runs:
        edges += [offset, offset + length]
    edges.append(size)
    with open(source, "rb", buffering=0) as src:
        for i in range(0, len(edges), 2):  # the gaps between written runs: from the parent
            p, z = _copy_sparse(src.fileno(), fd, edges[i], edges[i + 1])
            pages, zeros = pages + p, zeros + z
        for offset, length in runs:  # the written runs: already there; zero pages become holes
            p, z = _copy_sparse(fd, fd, offset, offset + length)
            pages, zeros = pages + p, zeros + z
    return pages, zeros


def _copy_sparse(src: int, dst: int, start: int, end: int, chunk: int = COPY_CHUNK) -> tuple[int, int]:
    pages = zeros = 0
    pos = start
    while pos < end:
        block = os.pread(src, min(chunk, end - pos), pos)
        if not block:
            raise VmmError(f"the memory image ends at {pos:#x}, before {end:#x}")
        if block.count(0) == len(block):
            zeros += len(block) // PAGE_SIZE
            if src == dst:
                punch_hole(dst, pos, len(block))
        else:
            view = memoryview(block)
            for i in range(0, len(block), PAGE_SIZE):
                page = view[i : i + PAGE_SIZE]
                if page == ZERO_PAGE:
                    zeros += 1
                    if src == dst:
                        punch_hole(dst, pos + i, PAGE_SIZE)
                else:
                    pages += 1
                    if src != dst:
                        os.pwrite(dst, page, pos + i)
        pos += len(block)
    return pages, zeros
