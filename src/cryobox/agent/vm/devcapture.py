"""Capturing a running restored VM in one short pause: its device state and the pages it wrote, nothing else.

A restored VM's RAM is a private (``share=off``) mapping of its parent image: every page it never wrote is
still the parent's. So a snapshot over that parent needs only

1. the device state: QEMU's ``xen-save-devices-state`` (``live=false``: it must not inactivate the disks)
   writes every section but RAM, ~20 KiB in ~1.5 ms under TCG; it has no configuration section, which
   :func:`~cryobox.agent.store.vmstream.devices_vmstate` prepends from the vmstate the VM was restored from, so
   ``migrate-incoming`` loads it over the layer's mapping like any template;
2. the pages it wrote, named by ``pagemap`` (:func:`.pagemap.written_runs`) and copied from
   ``/proc/<qemu>/mem`` into a staging buffer faulted in before the pause, written into the layer (a reflink
   clone of the parent) after it.

The pause is ``stop`` + the disk clone + both of these + ``cont``: it grows with what the guest wrote, not with
its RAM, and nothing is streamed afterwards. A VM without a parent file to clone (lazily paged, a cold fork),
one already paused, or a QEMU without the command is captured by :func:`.capture.capture` instead.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ...errors import VmmError
from .capture import CaptureReport, ram_mapping
from .microvm import MicroVM
from .pagemap import written_runs
from .states import VmState

SAVE_DEVICES = "xen-save-devices-state"
COPY_BYTES = 4 << 20
BUFFER_BYTES = 512 << 20  # written pages held in memory during a pause; past that they go to the file at once
BUFFER_MARGIN = 16 << 20  # for pages written between sizing the buffer and the pause


@dataclass(frozen=True)
class WrittenPagesCopy:
    runs: list[tuple[int, int]]
    """``(offset, length)`` in bytes of every run of written pages copied into the layer."""

    @property
    def bytes(self) -> int:
        return sum(length for _, length in self.runs)


async def saves_devices(vm: MicroVM) -> bool:
    """Whether ``vm``'s QEMU has ``xen-save-devices-state`` (built into every x86 system emulator we saw)."""
    commands = await vm.execute("query-commands")
    return any(c.get("name") == SAVE_DEVICES for c in commands)


def staging_buffer(pid: int, lo: int, hi: int) -> mmap.mmap:
    """Memory for the written pages, allocated and faulted in *before* the pause (``MAP_POPULATE``): sized from
    what the guest has written so far plus a margin, at most :data:`BUFFER_BYTES`."""
    written = sum(length for _, length in written_runs(pid, lo, hi))
    size = min(BUFFER_BYTES, written + written // 4 + BUFFER_MARGIN)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)


Pending = list[tuple[int, int, int]]
"""``(offset in the image, position in the buffer, length)`` of what waits in the staging buffer."""


def copy_written(
    pid: int, lo: int, hi: int, fd: int, buffer: mmap.mmap | bytearray
) -> tuple[list[tuple[int, int]], Pending]:
    """Copy every written page of the mapping ``[lo, hi)`` of ``pid``: into ``buffer`` while it has room (for
    :func:`write_pending` to put at their offsets of ``fd`` after the pause: a write into a reflinked file
    unshares its blocks, several times slower than the copy), the rest straight to ``fd``."""
    runs = written_runs(pid, lo, hi)
    pending: Pending = []
    staged = memoryview(buffer)
    pos = 0
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for offset, length in runs:
            done = 0
            while done < length:
                n = min(COPY_BYTES, length - done)
                if pos + n <= len(staged):
                    got = os.preadv(mem, [staged[pos : pos + n]], lo + offset + done)
                    pending.append((offset + done, pos, n))
                    pos += n
                else:
                    data = os.pread(mem, n, lo + offset + done)
                    got = len(data)
                    os.pwrite(fd, data, offset + done)
                if got != n:
                    raise VmmError(f"short read of QEMU {pid}'s RAM at {offset + done:#x}")
                done += n
    finally:
        os.close(mem)
        staged.release()
    return runs, pending


def write_pending(fd: int, buffer: mmap.mmap | bytearray, pending: Pending) -> None:
    with memoryview(buffer) as staged:
        for offset, pos, n in pending:
            os.pwrite(fd, staged[pos : pos + n], offset)


async def capture_written(
    vm: MicroVM,
    memory_fd: int,
    devices: Path,
    capture_disk: Callable[[], Awaitable[None]],
) -> CaptureReport[WrittenPagesCopy]:
    """Pause running ``vm``, save its disk (``capture_disk``), its device state (to ``devices``) and the pages it
    wrote (into ``memory_fd``, a clone of the image it maps), and continue it.

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
        buffer = await asyncio.to_thread(staging_buffer, pid, lo, hi)
        try:
            return await _capture(vm, pid, (lo, hi), memory_fd, fdset, capture_disk, buffer)
        finally:
            buffer.close()
    finally:
        if vm.state.alive:
            await vm.execute("remove-fd", {"fdset-id": fdset})


async def _capture(
    vm: MicroVM,
    pid: int,
    mapping: tuple[int, int],
    memory_fd: int,
    fdset: int,
    capture_disk: Callable[[], Awaitable[None]],
    buffer: mmap.mmap,
) -> CaptureReport[WrittenPagesCopy]:
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
        runs, pending = await asyncio.to_thread(copy_written, pid, lo, hi, memory_fd, buffer)
        lap("pages")
    finally:
        if vm.state.alive:
            await vm.execute("cont")
            vm.state = VmState.RUNNING
            lap("cont")
    pause_ms = (time.monotonic() - started) * 1000
    await asyncio.to_thread(write_pending, memory_fd, buffer, pending)
    return CaptureReport(
        mode="devices",
        pause_ms=round(pause_ms, 1),
        total_ms=round(pause_ms, 1),
        qemu_downtime_ms=None,
        prepopulate_ms=0.0,
        result=WrittenPagesCopy(runs),
        phases_ms=phases,
    )
