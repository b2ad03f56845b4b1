"""One recipe build VM: cryobox's own Debian as its OS, the image being built as a chain of qcow2 step layers.

Disks: the root disk is an overlay of the ``base`` template's root filesystem (the builder's OS: Python, mount,
mkfs, resize2fs), ``vdb`` is the target (the top of the layer chain, qcow2), ``vdc`` the inputs (an ext4 the host
wrote from opaque files: context archives and image layers; the host never reads inside them). Steps run through
the in-guest driver ``python3 -m cryobox_guest.build`` (:mod:`cryobox.guest.build`), one command per call, its
output streamed as build logs. After a step, :meth:`BuildSession.cut_layer` freezes the target's filesystem,
switches QEMU to a new overlay (``blockdev-snapshot-sync``, ``mode=existing``) and thaws it: the layer just left
behind holds exactly that step's writes, consistent, and becomes the step's cache entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import CryoboxError
from ...image.builder import ImageSet
from ..disk.qcow2 import create_overlay
from ..guest.client import GuestClient
from ..guest.exec import ExecSpec, stream_exec
from ..vm import MachineConfig, MemoryBacking, MicroVM, NetAttach, VmPaths
from ..vm.jail import VmJail
from .builder import Builder, restore_builder
from .buildvm import BOOT_TIMEOUT_S

STEP_TIMEOUT_S = 3600.0
DRIVER = "python3 -m cryobox_guest.build"
TARGET_DEVICE = "/dev/vdb"
INPUTS_DEVICE = "/dev/vdc"
TARGET_DRIVE = "data0"

OutputSink = Callable[[str, str], None]
"""Receives the driver's output: (stream ``stdout``/``stderr``, one line)."""


class StepFailed(CryoboxError):
    """A recipe step exited non-zero (the caller names the step; ``tail`` is its last output)."""

    def __init__(self, message: str, exit_code: int, tail: list[str]) -> None:
        super().__init__(message, details={"exit_code": exit_code})
        self.exit_code = exit_code
        self.tail = tail


@dataclass
class _Lines:
    """Splits streamed text into lines per stream; keeps a tail for error messages."""

    sink: OutputSink
    tail: list[str]
    partial: dict[str, str]

    def feed(self, stream: str, text: str) -> None:
        buffered = self.partial.get(stream, "") + text
        *lines, rest = buffered.split("\n")
        self.partial[stream] = rest
        for line in lines:
            self._emit(stream, line)

    def flush(self) -> None:
        for stream, rest in list(self.partial.items()):
            if rest:
                self._emit(stream, rest)
        self.partial.clear()

    def _emit(self, stream: str, line: str) -> None:
        line = line.rstrip("\r")
        self.tail.append(line)
        del self.tail[:-40]
        self.sink(stream, line)


class BuildSession:
    def __init__(self, vm: MicroVM, guest: GuestClient, paths: VmPaths, jail: VmJail | None, top: Path) -> None:
        self.vm = vm
        self.guest = guest
        self.paths = paths
        self.jail = jail
        self.top = top
        """The layer QEMU writes now (inside the session directory)."""
        self.cut = 0

    async def driver(self, command: str, payload: dict[str, Any] | None, sink: OutputSink) -> None:
        """Run one driver command; :class:`StepFailed` unless it exits 0."""
        cmd = f"{DRIVER} {command}"
        if payload is not None:
            cmd += " " + shlex.quote(json.dumps(payload, separators=(",", ":")))
        await self._run(cmd, command, sink, STEP_TIMEOUT_S)

    async def shell(self, cmd: str, sink: OutputSink, timeout_s: float = 600.0) -> None:
        """A command of the builder's own OS (as root, outside the target)."""
        await self._run(cmd, cmd.split()[0], sink, timeout_s)

    async def _run(self, cmd: str, what: str, sink: OutputSink, timeout_s: float) -> None:
        """``cmd`` streamed line by line into ``sink``; :class:`StepFailed` (naming ``what``) unless it exits 0."""
        lines = _Lines(sink, [], {})
        result = None
        async for event in stream_exec(self.guest, ExecSpec(cmd=cmd, timeout_s=timeout_s)):
            if event.kind == "exit":
                result = event.result
            else:
                lines.feed(event.kind, event.text)
        lines.flush()
        if result is None:
            raise StepFailed(f"{what} ended without a result", -1, lines.tail)
        if result.timed_out:
            raise StepFailed(f"{what} timed out after {timeout_s:.0f}s", result.exit_code, lines.tail)
        if result.exit_code != 0:
            raise StepFailed(f"{what} failed with exit code {result.exit_code}", result.exit_code, lines.tail)

    async def cut_layer(self, sink: OutputSink) -> Path:
        """Close the current layer (returned: it holds every write since the previous cut) and go on in a new one."""
        self.cut += 1
        closed = self.top
        following = self.paths.root / f"layer-{self.cut:03d}.qcow2"
        create_overlay(following, closed)
        if self.jail is not None:
            os.chown(following, self.jail.uid, self.jail.uid)
        await self.driver("freeze", None, sink)
        try:
            await self.vm.execute(
                "blockdev-snapshot-sync",
                {"device": TARGET_DRIVE, "snapshot-file": str(following), "format": "qcow2", "mode": "existing"},
            )
        finally:
            await self.driver("thaw", None, sink)
        self.top = following
        return closed


@contextlib.asynccontextmanager
async def build_session(
    *,
    name: str,
    os_images: ImageSet,
    machine: MachineConfig,
    run_dir: Path,
    target_base: Path,
    target_bytes: int,
    inputs: Path,
    net: NetAttach | None,
    jail: VmJail | None,
    progress: Callable[[str], None],
    builder: Builder | None = None,
) -> AsyncIterator[BuildSession]:
    """A running build VM whose target is a new layer over ``target_base``; everything is removed on exit.
    With ``builder`` it is restored from the host's baked build VM (:mod:`.builder`; ``inputs`` must then be
    :data:`~.builder.INPUTS_BYTES` long), else cold-booted."""
    paths = VmPaths(run_dir / name)
    shutil.rmtree(paths.root, ignore_errors=True)
    paths.root.mkdir(parents=True)
    vm: MicroVM | None = None
    try:
        top = paths.root / "layer-000.qcow2"
        create_overlay(top, target_base, target_bytes)
        started = time.monotonic()
        if builder is not None:
            vm, guest = await restore_builder(builder, name, machine, paths, top, inputs, net, jail)
            progress(f"build VM restored in {time.monotonic() - started:.2f}s")
        else:
            disk = paths.root / "os.qcow2"
            create_overlay(disk, os_images.rootfs.image)
            memory = paths.root / "memory"
            with open(memory, "wb") as fh:
                fh.truncate(machine.memory_mib << 20)
            vm = MicroVM(
                name, machine, paths, MemoryBacking(memory, share=True), disk, net, jail, data_disks=(top, inputs)
            )
            await vm.start(incoming=False)
            await vm.wait_guest_ready(BOOT_TIMEOUT_S)
            progress(f"build VM up after {time.monotonic() - started:.1f}s")
            guest = await vm.connect_guest()
        session = BuildSession(vm, guest, paths, jail, top)
        # a restored guest may hold its placeholder disks' first blocks in the page cache: drop them first
        await session.shell("blockdev --flushbufs /dev/vdb /dev/vdc", lambda stream, line: progress(line))
        yield session
    finally:
        if vm is not None:
            await vm.kill()
        shutil.rmtree(paths.root, ignore_errors=True)


__all__ = ["BuildSession", "OutputSink", "StepFailed", "build_session"]
