"""Capturing a running restored VM in one short pause: its device state and the pages it wrote, nothing else.

A restored VM's RAM is a private (``share=off``) mapping of its parent image: every page it never wrote is
still the parent's. So a snapshot over that parent needs only

1. the device state: QEMU's ``xen-save-devices-state`` (``live=false``: it must not inactivate the disks)
   writes every section but RAM (a few KiB, quickly); it has no configuration section, which
   :func:`~cryobox.agent.vm.vmstream.devices_vmstate` prepends from the vmstate the VM was restored from, so
   ``migrate-incoming`` loads it over the layer's mapping like any template;
2. the pages it wrote, named by ``pagemap`` (:func:`.pagemap.written_runs`) and copied out of QEMU
   (``process_vm_readv``, :mod:`.procmem`) into a staging buffer faulted in before the pause, settled into the
   layer (a reflink clone of the parent) after it.

The pause is ``stop`` + the disk clone + both of these + ``cont``: it grows with what the guest wrote, not with
its RAM, and nothing is streamed afterwards. A VM without a parent file to clone (lazily paged, a cold fork),
one already paused, or a QEMU without the command is captured by :func:`..vm.migration.capture` instead.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import VmmError
from ..vm.microvm import MicroVM
from ..vm.migration import CaptureReport, ram_mapping
from ..vm.states import VmState
from .pagemap import written_runs
from .procmem import RemoteMemory
from .staging import StagingPool, allocate

SAVE_DEVICES = "xen-save-devices-state"
COPY_BYTES = 1 << 20
PAGE_SIZE = 4096
READERS = 2
PARALLEL_BYTES = 8 << 20
BUFFER_BYTES = 512 << 20  # written pages held in memory during a pause; past that they go to the file at once
BUFFER_MARGIN = 16 << 20  # for pages written between sizing the buffer and the pause


@dataclass(frozen=True)
class WrittenPagesCopy:
    runs: list[tuple[int, int]]
    """``(offset, length)`` in bytes of every run of written pages copied into the layer."""
    direct: list[tuple[int, int]] = field(default_factory=list)
    """The part of ``runs`` that did not fit the staging buffer: written into the file inside the pause."""

    @property
    def bytes(self) -> int:
        return sum(length for _, length in self.runs)


async def saves_devices(vm: MicroVM) -> bool:
    """Whether ``vm``'s QEMU has ``xen-save-devices-state`` (built into every x86 system emulator we saw)."""
    if vm.commands is None:
        vm.commands = frozenset(str(c.get("name")) for c in await vm.execute("query-commands"))
    return SAVE_DEVICES in vm.commands


def staging_size(pid: int, lo: int, hi: int) -> tuple[int, int]:
    """``(need, want)``: room for what the guest has written so far plus what it may write before the pause
    (a kept buffer that large will do), and the size to allocate when none is kept (a margin more, so that the
    next capture of a guest that went on writing still fits); both at most :data:`BUFFER_BYTES`."""
    written = sum(length for _, length in written_runs(pid, lo, hi))
    need = min(BUFFER_BYTES, written + BUFFER_MARGIN)
    return need, min(BUFFER_BYTES, max(need, written + written // 4 + 4 * BUFFER_MARGIN))


Pending = list[tuple[int, int, int]]
"""``(offset in the image, position in the buffer, length)`` of what waits in the staging buffer."""


@dataclass(frozen=True)
class Staged:
    """What :func:`copy_written` copied: every written run, the pieces held in the buffer, the runs that went
    straight to the file."""

    runs: list[tuple[int, int]]
    pending: Pending
    direct: list[tuple[int, int]]
    scan_ms: float = 0.0
    """Of the copy: finding the written pages."""
    queued_ms: float = 0.0
    """Before it: waiting for a thread to run it on."""


def copy_written(
    pid: int, lo: int, hi: int, fd: int, buffer: mmap.mmap | bytearray, queued: float | None = None
) -> Staged:
    """Copy every written page of the mapping ``[lo, hi)`` of ``pid`` (:class:`.procmem.RemoteMemory`): into
    ``buffer`` while it has room (for a consumer to settle after the pause: a write into a reflinked file
    unshares its blocks, several times slower than the copy), the rest straight to ``fd``."""
    started = time.monotonic()
    waited = 0.0 if queued is None else round((started - queued) * 1000, 2)
    runs = written_runs(pid, lo, hi)
    scanned = ms_since(started)
    pending: Pending = []
    direct: list[tuple[int, int]] = []
    pos = 0
    for offset, length in runs:
        done = 0
        while done < length:
            n = min(COPY_BYTES, length - done)
            if pos + n > len(buffer):
                direct.append((offset + done, length - done))
                break
            pending.append((offset + done, pos, n))
            pos += n
            done += n
    with RemoteMemory(pid) as remote, memoryview(buffer) as staged:
        _read_parallel(pid, staged, [(lo + offset, at, n) for offset, at, n in pending])
        if direct:
            with memoryview(bytearray(COPY_BYTES)) as bounce:
                for offset, length in direct:
                    for done in range(0, length, COPY_BYTES):
                        n = min(COPY_BYTES, length - done)
                        remote.read(bounce, [(lo + offset + done, 0, n)])
                        os.pwrite(fd, bounce[:n], offset + done)
    return Staged(runs, pending, _merge(direct), scanned, waited)


def _read_parallel(pid: int, staged: memoryview, copies: list[tuple[int, int, int]]) -> None:
    """The copies, by :data:`READERS` threads (the guest is stopped: the cores are ours). The copy's cost is
    per page (pinning and mapping each one in the kernel): 71 MiB in 17–19 ms on one thread, 10–12 on two."""
    if sum(n for _, _, n in copies) < PARALLEL_BYTES:
        with RemoteMemory(pid) as remote:
            remote.read(staged, copies)
        return

    def read(part: list[tuple[int, int, int]]) -> None:
        with RemoteMemory(pid) as remote:
            remote.read(staged, part)

    with ThreadPoolExecutor(READERS, thread_name_prefix="pause-copy") as pool:
        list(pool.map(read, [copies[i::READERS] for i in range(READERS)]))


def _merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for offset, length in runs:
        if merged and merged[-1][0] + merged[-1][1] == offset:
            merged[-1] = (merged[-1][0], merged[-1][1] + length)
        else:
            merged.append((offset, length))
    return merged


def write_pending(fd: int, buffer: mmap.mmap | bytearray, pending: Pending) -> None:
    with memoryview(buffer) as staged:
        for offset, pos, n in pending:
            os.pwrite(fd, staged[pos : pos + n], offset)


Settle = Callable[[mmap.mmap, Staged], None]
"""What happens to the staged pages after the pause (in a thread, while the guest runs)."""


async def capture_written(
    vm: MicroVM,
    memory_fd: int,
    devices: Path,
    capture_disk: Callable[[], Awaitable[None]],
    settle: Settle | None = None,
    pool: StagingPool | None = None,
) -> CaptureReport[WrittenPagesCopy]:
    """Pause running ``vm``, save its disk (``capture_disk``), its device state (to ``devices``) and the pages it
    wrote (into a staging buffer; what does not fit, into ``memory_fd``, a clone of the image it maps), continue
    it, and hand the staged pages to ``settle`` (default: written at their offsets of ``memory_fd``).

    :raises VmmError: QEMU refused or a read failed; the VM is running again and nothing was kept.
    """
    if vm.state is not VmState.RUNNING or vm.pid is None:
        raise VmmError(f"a device-state capture needs a running VM, not {vm.state.value}")
    pid = vm.pid
    lo, hi = ram_mapping(pid, vm.memory.path)
    out = os.open(devices, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        vm.qmp.send_fd_scm(out)
        fdset = int((await vm.execute("add-fd", {"opaque": "cryobox-devices"}))["fdset-id"])
    finally:
        os.close(out)  # QEMU holds its own copy in the fd set
    try:
        started = time.monotonic()
        staging = pool if pool is not None else StagingPool(max_bytes=0)
        need, want = await asyncio.to_thread(staging_size, pid, lo, hi)
        kept = staging.take(need)
        buffer = kept if kept is not None else await asyncio.to_thread(allocate, want)
        steps = {"buffer": ms_since(started)}
        try:
            report = await _capture(vm, pid, (lo, hi), memory_fd, fdset, capture_disk, buffer)
            staged = report.result
            started = time.monotonic()
            if settle is None:
                await asyncio.to_thread(write_pending, memory_fd, buffer, staged.pending)
            else:
                await asyncio.to_thread(settle, buffer, staged)
            steps["settle"] = ms_since(started)
            return CaptureReport(
                mode=report.mode,
                pause_ms=report.pause_ms,
                total_ms=report.total_ms,
                qemu_downtime_ms=None,
                prepopulate_ms=0.0,
                result=WrittenPagesCopy(staged.runs, staged.direct),
                phases_ms=report.phases_ms,
                steps_ms=steps,
                counts={
                    "written_runs": len(staged.runs),
                    "staged_pages": sum(n for _, _, n in staged.pending) // PAGE_SIZE,
                    "direct_pages": sum(n for _, n in staged.direct) // PAGE_SIZE,
                },
            )
        finally:
            staging.release(buffer)
    finally:
        if vm.state.alive:
            await vm.execute("remove-fd", {"fdset-id": fdset})


def ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)


async def _capture(
    vm: MicroVM,
    pid: int,
    mapping: tuple[int, int],
    memory_fd: int,
    fdset: int,
    capture_disk: Callable[[], Awaitable[None]],
    buffer: mmap.mmap,
) -> CaptureReport[Staged]:
    lo, hi = mapping
    started = time.monotonic()
    phases: dict[str, float] = {}
    mark = started

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round((now - mark) * 1000, 2)
        mark = now

    await vm.execute("stop")
    vm.state = VmState.PAUSED
    lap("stop")
    try:
        await capture_disk()
        lap("disk")
        await vm.execute(SAVE_DEVICES, {"filename": f"/dev/fdset/{fdset}", "live": False})
        lap("devices")
        # inside the pause, on purpose (the bytes of this instant), in a thread (other VMs' requests go on)
        queued = time.monotonic()
        staged = await asyncio.to_thread(copy_written, pid, lo, hi, memory_fd, buffer, queued)
        lap("pages")
        phases["pages.scan"] = staged.scan_ms
        phases["pages.queued"] = staged.queued_ms
    finally:
        if vm.state.alive:
            await vm.execute("cont")
            vm.state = VmState.RUNNING
            lap("cont")
    pause_ms = (time.monotonic() - started) * 1000
    return CaptureReport(
        mode="devices",
        pause_ms=round(pause_ms, 1),
        total_ms=round(pause_ms, 1),
        qemu_downtime_ms=None,
        prepopulate_ms=0.0,
        result=staged,
        phases_ms=phases,
    )
