"""Baked templates: a cold boot whose RAM lives in a ``share=on`` file, warmed up, quiesced and snapshotted.

A template directory ``<templates_dir>/<name>-<generation>/`` holds::

    memory        raw guest RAM (restores map it MAP_PRIVATE; never modified)
    vmstate       device state only (x-ignore-shared skipped the RAM)
    disk.qcow2    root-disk overlay over the read-only rootfs base
    console.log   the bake's guest console
    manifest.json written last; a directory without it is an unfinished bake and is never used

The generation is a hash of every input (spec, image cache keys, machine config, QEMU version), so a re-bake
with different inputs gets a new directory and never reuses stale files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import CryoboxError
from ...image.builder import ImageSet
from ...image.specs import TemplateSpec
from ...objstore.pins import PINS_FIELD
from ...util.encoding import b64
from ...util.files import fsync_dir, stable_hash, write_json_atomic
from ...util.proc import Progress
from ...util.progress import as_reporter
from ..disk.qcow2 import create_overlay
from ..guest.exec import run_exec
from ..snapshot.layout import ImageFiles
from ..vm import MachineConfig, MemoryBacking, MicroVM, NetAttach, VmPaths, qemu
from ..vm.jail import JailSettings, VmJail, one_off_uid
from .quiesce import require_quiesced
from .startcmd import config_of, recipe_of, start_and_wait

BakeNet = Callable[[], AbstractAsyncContextManager[NetAttach]]
"""Makes the private network a bake's NIC plugs into (a throwaway namespace with a tap), and removes it."""

FORMAT_VERSION = 1
COLD_BOOT_TIMEOUT_S = 180.0


def qemu_version() -> str:
    return qemu.version_line()


@dataclass(frozen=True)
class Template(ImageFiles):
    name: str
    generation: str
    path: Path
    machine: MachineConfig
    manifest: dict[str, Any]

    @property
    def created_at(self) -> float:
        return float(self.manifest["created_at"])

    @property
    def hot_key(self) -> str:
        """Name of the template's memory copy in the host's hot directory."""
        return f"tpl-{self.name}-{self.generation}"


def record_pins(template: Template, pins: dict[str, dict[str, Any]]) -> Template:
    """``template`` with the pins publishing it returned (``store.publish.publish_template``) kept in its local
    manifest too (rewritten atomically, only when they are new): lazy restores of it name its memory index by
    its pin, which the memory server checks."""
    if template.manifest.get(PINS_FIELD) == pins:
        return template
    manifest = {**template.manifest, PINS_FIELD: pins}
    write_json_atomic(template.path / "manifest.json", manifest)
    return dataclasses.replace(template, manifest=manifest)


def generation_of(spec: TemplateSpec, images: ImageSet, machine: MachineConfig, qemu: str) -> str:
    return stable_hash(
        {
            "format": FORMAT_VERSION,
            "spec": spec.to_json(),
            "images": images.identity,
            "machine": machine.identity(),
            "qemu": qemu,
        }
    )


class TemplateBaker:
    def __init__(
        self,
        templates_dir: Path,
        run_dir: Path,
        progress: Progress,
        bake_net: BakeNet | None = None,
        jail: JailSettings | None = None,
    ) -> None:
        self.templates_dir = templates_dir
        self.run_dir = run_dir
        self.progress = progress
        self.bake_net = bake_net
        self.jail = jail
        """Bakes run jailed too (each with a uid of its own, :func:`.vm.jail.one_off_uid`): a package's code
        runs in the bake guest."""

    def load(self, spec: TemplateSpec, images: ImageSet, machine: MachineConfig) -> Template | None:
        generation = generation_of(spec, images, machine, qemu_version())
        path = self.templates_dir / f"{spec.name}-{generation}"
        manifest_path = path / "manifest.json"
        if not manifest_path.exists():
            return None
        return Template(spec.name, generation, path, machine, json.loads(manifest_path.read_text()))

    async def ensure(self, spec: TemplateSpec, images: ImageSet, machine: MachineConfig) -> Template:
        """Return the template for these inputs, baking it first if no finished bake exists."""
        found = self.load(spec, images, machine)
        if found is not None:
            return found
        generation = generation_of(spec, images, machine, qemu_version())
        self.templates_dir.mkdir(parents=True, exist_ok=True)
        with open(self.templates_dir / f".{spec.name}-{generation}.lock", "w") as lock:
            # another process baking the same generation: wait for it, then use its result
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            found = self.load(spec, images, machine)
            if found is not None:
                return found
            return await self.bake(spec, images, machine)

    async def bake(self, spec: TemplateSpec, images: ImageSet, machine: MachineConfig) -> Template:
        qemu = qemu_version()
        generation = generation_of(spec, images, machine, qemu)
        final = self.templates_dir / f"{spec.name}-{generation}"
        work = self.templates_dir / f".{spec.name}-{generation}.baking{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        vm_paths = VmPaths(self.run_dir / f"bake-{generation[:12]}")
        shutil.rmtree(vm_paths.root, ignore_errors=True)
        vm: MicroVM | None = None
        stack = contextlib.AsyncExitStack()
        try:
            disk = work / "disk.qcow2"
            create_overlay(disk, images.rootfs.image)
            memory = work / "memory"
            with open(memory, "wb") as fh:
                fh.truncate(machine.memory_mib << 20)
            if machine.nic and self.bake_net is None:
                raise CryoboxError("a machine with a NIC needs a bake network (bake_net)")
            net = await stack.enter_async_context(self.bake_net()) if machine.nic and self.bake_net else None
            uid = stack.enter_context(one_off_uid(self.jail, self.run_dir))
            jail = VmJail(self.jail, uid) if self.jail is not None and uid is not None else None
            vm = MicroVM(f"bake-{spec.name}", machine, vm_paths, MemoryBacking(memory, share=True), disk, net, jail)
            phase = stack.enter_context(as_reporter(self.progress).phase(f"bake {spec.name}", 3 + len(spec.warmup)))
            self.progress(f"baking template {spec.name} ({generation}): cold boot")
            started = time.monotonic()
            await vm.start(incoming=False)
            await vm.wait_guest_ready(COLD_BOOT_TIMEOUT_S)
            boot_s = time.monotonic() - started
            phase.advance()
            self.progress(f"  guest agent answered after {boot_s:.1f}s; warming up")
            guest = await vm.connect_guest()
            for path, content in spec.files.items():
                await guest.call("write_file", {"path": path, "content": b64(content.encode())})
            phase.advance()
            for command in spec.warmup:
                phase.update(command[:60])
                result = await run_exec(guest, command, timeout_s=300)
                if result.exit_code != 0:
                    raise CryoboxError(f"warm-up command failed ({result.exit_code}): {command}\n{result.stderr}")
                phase.advance()
            recipe, image_config = recipe_of(spec), config_of(spec)
            if recipe is not None and image_config is not None:
                await start_and_wait(guest, image_config, recipe, self.progress)
            await guest.call("sync", {}, timeout=60)
            await require_quiesced(guest, "bake")
            self.progress("  snapshotting")
            await vm.save_state(work / "vmstate")
            phase.advance()
            await vm.kill()
            shutil.copy2(vm_paths.console_log, work / "console.log")
            for name in ("memory", "vmstate", "disk.qcow2"):
                with open(work / name, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.chown(work / name, os.getuid(), os.getgid())  # the bake's jail uid owned what QEMU wrote
                (work / name).chmod(0o444)
            manifest = {
                "format": FORMAT_VERSION,
                "name": spec.name,
                "generation": generation,
                "spec": spec.to_json(),
                "images": images.identity,
                "machine": machine.identity(),
                "qemu": qemu,
                "kernel": str(machine.kernel),
                "initrd": str(machine.initrd),
                "rootfs": str(images.rootfs.image),
                **({"agentdisk": str(machine.agent_disk)} if machine.agent_disk is not None else {}),
                "cold_boot_s": round(boot_s, 3),
                "created_at": time.time(),
            }
            write_json_atomic(work / "manifest.json", manifest)
            os.replace(work, final)
            fsync_dir(final.parent)
            self.progress(f"  template {spec.name} ready ({generation})")
            return Template(spec.name, generation, final, machine, manifest)
        finally:
            if vm is not None:
                await vm.kill()
            await stack.aclose()
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(vm_paths.root, ignore_errors=True)
