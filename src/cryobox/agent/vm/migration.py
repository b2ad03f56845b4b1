"""Capturing a live VM's state without stopping it for longer than its device state takes to save.

A restored VM's RAM is a ``share=off`` (MAP_PRIVATE) mapping of its parent's image, so ``x-ignore-shared``
does not skip it and a stopped migration would copy all of it inside the pause. Instead (docs/design/snapshots.md,
"The stream capture"; most running VMs take the short pause of :mod:`cryobox.agent.snapshot.devstate`):

1. pre-populate the RAM mapping from outside, reading ``/proc/<qemu>/mem`` while the guest runs (QEMU's
   background snapshot otherwise faults every page in during its setup, with the guest stopped);
2. ``stop``; capture the disk (a reflink clone of the qcow2 overlay: ``stop`` drained and flushed it);
3. ``migrate`` with the ``background-snapshot`` capability to a file descriptor: QEMU saves the device state,
   write-protects RAM with userfaultfd and continues the guest; pages are streamed while it runs (a page the
   guest writes is saved first). QEMU 7.2 continues it itself (``RESUME``); 9.0+ restores the run state the
   migration started in, paused, so we ``cont`` it once the snapshot thread saves its first page
   (:func:`.qemu.background_snapshot_resumes`). The pause is steps 2–3.

A VM that is already paused (or about to be hibernated) is captured with a plain migration instead: it is not
running, so there is no pause to keep short, and it must stay stopped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

from ...errors import VmmError
from . import qemu
from .microvm import MicroVM
from .states import VmState

log = logging.getLogger(__name__)

MAX_BANDWIDTH = 8 << 30  # bytes/s; the default (128 MiB/s) throttles a local stream for nothing
FD_NAME = "cryobox-snapshot"
PIPE_BYTES = 1 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class CaptureReport(Generic[T]):
    mode: str
    """``background`` (guest kept running) or ``stopped``."""
    pause_ms: float
    """From our ``stop`` to the guest running again (0 for a VM that was not running)."""
    total_ms: float
    qemu_downtime_ms: float | None
    prepopulate_ms: float
    result: T
    """What the stream consumer returned."""
    phases_ms: dict[str, float] = field(default_factory=dict)
    """Where the pause went, for captures that time their steps (``stop``, ``disk``, ``devices``, ``pages``)."""
    steps_ms: dict[str, float] = field(default_factory=dict)
    """Where the rest of the capture went (before and after the pause: ``buffer``, ``settle``, ...)."""
    counts: dict[str, int] = field(default_factory=dict)
    """What the capture found, for captures that count it (pages staged, runs written, ...)."""


def ram_mapping(pid: int, memory_path: Path) -> tuple[int, int]:
    """The address range of the guest RAM mapping in QEMU's address space."""
    target = str(memory_path)
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") == target:
                lo, hi = fields[0].split("-")
                return int(lo, 16), int(hi, 16)
    raise VmmError(f"QEMU {pid} has no mapping of {memory_path}")


def prepopulate(pid: int, memory_path: Path, chunk: int = 4 << 20) -> None:
    """Fault every page of the RAM mapping in (read-only) through ``/proc/<pid>/mem``."""
    lo, hi = ram_mapping(pid, memory_path)
    buffer = bytearray(chunk)
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for offset in range(lo, hi, chunk):
            view = memoryview(buffer)[: min(chunk, hi - offset)]
            os.preadv(fd, [view], offset)
    finally:
        os.close(fd)


async def _capabilities(vm: MicroVM, background: bool) -> None:
    caps = [
        {"capability": "x-ignore-shared", "state": True},
        {"capability": "events", "state": True},
        {"capability": "background-snapshot", "state": background},
    ]
    await vm.execute("migrate-set-capabilities", {"capabilities": caps})
    await vm.execute("migrate-set-parameters", {"max-bandwidth": MAX_BANDWIDTH})


async def _open_stream(vm: MicroVM) -> BinaryIO:
    """A pipe whose write end QEMU holds (as ``fd:<FD_NAME>``); returns the read end."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        vm.qmp.send_fd_scm(write_fd)
        await vm.execute("getfd", {"fdname": FD_NAME})
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return os.fdopen(read_fd, "rb", buffering=0)


SAVED_POLL_S = 0.0005


async def _continue_when_saved(vm: MicroVM, timeout: float) -> None:
    """A QEMU whose background snapshot leaves a VM we stopped stopped (:func:`.qemu.background_snapshot_resumes`
    is false): ``cont`` it as soon as its device state is saved and its RAM write-protected, which is when the
    snapshot thread starts saving pages (``ram.normal``/``ram.duplicate`` leave 0: the thread schedules QEMU's own
    resume, a no-op for a paused VM, just before its first page). A migration that fails or completes first ends
    the wait too (:func:`_wait` reports it)."""
    async with asyncio.timeout(timeout):
        while True:
            info = await vm.execute("query-migrate")
            ram = info.get("ram") or {}
            if info.get("status") in ("completed", "failed", "cancelled"):
                break
            if int(ram.get("normal", 0)) + int(ram.get("duplicate", 0)) > 0:
                break
            await asyncio.sleep(SAVED_POLL_S)
    if info.get("status") in ("failed", "cancelled"):
        return
    await vm.execute("cont")


async def _ensure_running(vm: MicroVM) -> None:
    """After our ``cont``: should QEMU's own deferred resume (which restores the run state the migration started
    in) have run after it, the run state says paused while the vCPUs run; ``cont`` again makes both agree."""
    status = await vm.execute("query-status")
    if not status.get("running"):
        await vm.execute("cont")


async def _wait(listener: Any, background: bool, started: float, timeout: float) -> tuple[float, float]:
    """Wait for completion (and, in background mode, the guest's RESUME); returns (pause_ms, total_ms)."""
    resumed: float | None = None
    completed: float | None = None
    async with asyncio.timeout(timeout):
        async for event in listener:
            now = time.monotonic()
            if event["event"] == "RESUME" and resumed is None:
                resumed = now
            elif event["event"] == "MIGRATION":
                status = event["data"]["status"]
                if status in ("failed", "cancelled"):
                    raise VmmError(f"snapshot migration {status}")
                if status == "completed":
                    completed = now
            if completed is not None and (resumed is not None or not background):
                break
    assert completed is not None
    pause = (resumed - started) * 1000 if resumed is not None else 0.0
    return pause, (completed - started) * 1000


async def _leave_postmigrate(vm: MicroVM) -> None:
    """A paused VM that was captured before idles in QEMU's ``postmigrate`` run state, from which QEMU refuses
    another migration ("Can't migrate the vm that was paused due to previous migration") and which no command leaves
    except ``cont``: so ``cont`` and ``stop`` go out back to back (pipelined, one round trip; the vCPUs run for
    well under a millisecond) and the VM is an ordinary paused one again. A paused sandbox can then be snapshotted,
    forked or hibernated any number of times."""
    status = await vm.execute("query-status")
    if status.get("status") == "postmigrate":
        await asyncio.gather(vm.execute("cont"), vm.execute("stop"))
        log.info("left QEMU's postmigrate state of a paused VM (cont + stop) for another capture")


async def capture(
    vm: MicroVM,
    consume: Callable[[BinaryIO], T],
    capture_disk: Callable[[], Awaitable[None]],
    *,
    keep_running: bool = True,
    timeout: float = 300.0,
) -> CaptureReport[T]:
    """Stream ``vm``'s full migration stream (device state + all RAM) into ``consume`` (run in a thread while
    QEMU writes, through a pipe) and call ``capture_disk`` at the instant the stream describes. A running VM
    with ``keep_running`` pauses only for its device state; any other VM ends stopped (``PAUSED``; QEMU
    accepts ``cont`` after the migration).

    :raises VmmError: QEMU refused or the migration failed (a running VM is continued again).
    """
    if vm.state not in (VmState.RUNNING, VmState.PAUSED):
        raise VmmError(f"cannot snapshot a VM in state {vm.state.value}")
    if vm.pid is None:
        raise VmmError("QEMU is not running")
    background = keep_running and vm.state is VmState.RUNNING and vm.memory.write_trackable
    # a running VM whose RAM cannot be write-protected (lazily paged from the memory server) is paused for a
    # plain migration and continued after it
    resume_after = keep_running and vm.state is VmState.RUNNING and not background
    prepopulate_ms = 0.0
    if background:
        t = time.monotonic()
        await asyncio.to_thread(prepopulate, vm.pid, vm.memory.path)
        prepopulate_ms = (time.monotonic() - t) * 1000
    if vm.state is VmState.PAUSED:
        await _leave_postmigrate(vm)
    await _capabilities(vm, background)
    stream = await _open_stream(vm)
    consumer: asyncio.Future[T] | None = None
    was_running = vm.state is VmState.RUNNING
    self_resuming = qemu.background_snapshot_resumes()
    try:
        with vm.qmp.listener(("MIGRATION", "RESUME")) as listener:
            started = time.monotonic()
            if was_running:
                await vm.execute("stop")
                vm.state = VmState.PAUSED
            await capture_disk()
            await vm.execute("migrate", {"uri": f"fd:{FD_NAME}"})
            consumer = asyncio.ensure_future(asyncio.to_thread(consume, stream))
            if background and not self_resuming:
                await _continue_when_saved(vm, timeout)
            pause_ms, total_ms = await _wait(listener, background, started, timeout)
        if background:
            if not self_resuming:
                await _ensure_running(vm)
            vm.state = VmState.RUNNING
        info = await vm.execute("query-migrate")
        result = await consumer
        if resume_after:
            await vm.execute("cont")
            vm.state = VmState.RUNNING
            pause_ms = (time.monotonic() - started) * 1000
    except BaseException:
        if (background or resume_after) and vm.state.alive:
            status = await vm.execute("query-status")
            if not status.get("running"):
                await vm.execute("cont")
            vm.state = VmState.RUNNING
        if vm.state.alive:
            with contextlib.suppress(VmmError):
                await vm.execute("migrate_cancel")  # closes QEMU's end of the pipe: the consumer sees EOF
        if consumer is not None:
            stream.close()  # QEMU closed its end on failure; the consumer sees EOF or a closed file
            await asyncio.gather(consumer, return_exceptions=True)
        raise
    finally:
        stream.close()
        if vm.state.alive:
            await vm.execute(
                "migrate-set-capabilities", {"capabilities": [{"capability": "background-snapshot", "state": False}]}
            )
    downtime = info.get("downtime")
    return CaptureReport(
        mode="background" if background else "stopped",
        pause_ms=round(pause_ms, 1) if background or resume_after else 0.0,
        total_ms=round(total_ms, 1),
        qemu_downtime_ms=float(downtime) if downtime is not None else None,
        prepopulate_ms=round(prepopulate_ms, 1),
        result=result,
    )
