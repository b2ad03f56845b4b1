"""The short-pause snapshot of a restored VM over its parent image (:mod:`..vm.devcapture`), as a memory layer.

The parent image is cloned (a reflink on the volume), the capture copies the pages the guest wrote into the
clone inside its pause, and the layer's accounting runs afterwards while the guest goes on: a written page whose
bytes equal the parent's stays shared, a zeroed one becomes a hole, the others are the layer's own pages (the
manifest's ``own_pages``, ``unchanged_written_pages`` and content digest, as for a streamed layer). The vmstate
is the device state behind the configuration section of the vmstate the VM was restored from.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import VmmError
from ..vm import MicroVM
from ..vm.capture import CaptureReport
from ..vm.devcapture import capture_written, saves_devices
from ..vm.states import VmState
from .memlayer import AllWritten, LayerImage, ParentImage, account_runs, clone_parent
from .vmstream import SplitStats, devices_vmstate

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
) -> CaptureReport[Split] | None:
    """The short-pause capture (:mod:`..vm.devcapture`): the device state and the pages ``vm`` wrote, into a
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
    try:
        report = await capture_written(vm, fd, devices, capture_disk)
        sink = LayerImage(fd, parent_fd, AllWritten(), parent.digest)
        pages, zeros = await asyncio.to_thread(account_runs, sink, report.result.runs)
    finally:
        os.close(fd)
        os.close(parent_fd)
    vmstate = devices_vmstate(vm.state_prefix, await asyncio.to_thread(devices.read_bytes))
    await asyncio.to_thread((work / "vmstate").write_bytes, vmstate)
    devices.unlink()
    os.replace(tmp, work / "memory")
    stats = SplitStats(pages=pages, zero_pages=zeros, vmstate_bytes=len(vmstate), blocks={"ram": ram_bytes})
    memory: dict[str, Any] = {
        "layered": True,
        "parent": {"key": parent.key, "digest": parent.digest},
        "digest": sink.digest(),
        "own_pages": sink.own_pages,
        "unchanged_written_pages": sink.same_pages,
    }
    return CaptureReport(
        mode=report.mode,
        pause_ms=report.pause_ms,
        total_ms=report.total_ms,
        qemu_downtime_ms=report.qemu_downtime_ms,
        prepopulate_ms=report.prepopulate_ms,
        result=Split(stats, memory),
        phases_ms=report.phases_ms,
    )
