"""Capturing a running restored VM in one short pause: its device state and the pages it wrote, nothing else.

A restored VM's RAM is a private (``share=off``) mapping of its parent image: every page it never wrote is
still the parent's. So a snapshot over that parent needs only

1. the device state: QEMU's ``xen-save-devices-state`` (``live=false``: it must not inactivate the disks)
   writes every section but RAM, ~20 KiB in ~1.5 ms under TCG; it has no configuration section, which
   :func:`~cryobox.agent.store.vmstream.devices_vmstate` prepends from the vmstate the VM was restored from, so
   ``migrate-incoming`` loads it over the layer's mapping like any template (QEMU then logs "Expected
   vmdescription section": not an error);
2. the pages it wrote, named by ``pagemap`` (:func:`.pagemap.written_runs`) and copied from
   ``/proc/<qemu>/mem`` straight into the layer (a reflink clone of the parent), run by run.

The pause is ``stop`` + the disk clone + both of these + ``cont``: it grows with what the guest wrote, not with
its RAM, and nothing is streamed afterwards. A VM without a parent file to clone (lazily paged, a cold fork),
one already paused, or a QEMU without the command is captured by :func:`.capture.capture` instead.
"""

from __future__ import annotations

import asyncio
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


def copy_written(pid: int, lo: int, hi: int, fd: int) -> list[tuple[int, int]]:
    """Copy every written page of the mapping ``[lo, hi)`` of ``pid`` to the same offset of ``fd``."""
    runs = written_runs(pid, lo, hi)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for offset, length in runs:
            done = 0
            while done < length:
                n = min(COPY_BYTES, length - done)
                data = os.pread(mem, n, lo + offset + done)
                if len(data) != n:
                    raise VmmError(f"short read of QEMU {pid}'s RAM at {offset + done:#x}")
                os.pwrite(fd, data, offset + done)
                done += n
    finally:
        os.close(mem)
    return runs


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
    started = time.monotonic()
    try:
        await vm.execute("stop")
        vm.state = VmState.PAUSED
        try:
            await capture_disk()
            await vm.execute(SAVE_DEVICES, {"filename": f"/dev/fdset/{fdset}", "live": False})
            # inside the pause, on purpose (the bytes of this instant), in a thread (other VMs' requests go on)
            runs = await asyncio.to_thread(copy_written, pid, lo, hi, memory_fd)
        finally:
            if vm.state.alive:
                await vm.execute("cont")
                vm.state = VmState.RUNNING
        pause_ms = (time.monotonic() - started) * 1000
    finally:
        if vm.state.alive:
            await vm.execute("remove-fd", {"fdset-id": fdset})
    return CaptureReport(
        mode="devices",
        pause_ms=round(pause_ms, 1),
        total_ms=round(pause_ms, 1),
        qemu_downtime_ms=None,
        prepopulate_ms=0.0,
        result=WrittenPagesCopy(runs),
    )
