"""Making MicroVMs: a per-VM run directory, a qcow2 overlay, and a QEMU waiting in ``-incoming defer`` with a
memory image mapped ``share=off``.

A restore source is a baked template or a snapshot; its memory is mapped from the host's hot copy on tmpfs
(one per image, shared by every VM restored from it), its disk overlay is copied (template: an empty overlay
over the template's disk; snapshot: a reflink clone of the snapshot's overlay). Fork children cold-boot from a
disk clone instead, with fresh, empty RAM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
from pathlib import Path

from ...errors import CryoboxError, VmmError
from ...netpolicy import EgressPolicy
from ..disk.volume import clone_file
from ..memory.hot import HotImages
from ..memory.settings import MemoryMode
from ..net.egress.service import EgressService
from ..net.pool import IndexAllocator, SlotPool
from ..net.slots import Slot
from ..snapshot.store import SnapshotImage
from ..templates.bake import Template
from ..vm import MachineConfig, MemoryBacking, MicroVM, NetAttach, VmPaths, VmState
from ..vm.jail import EXTRA_UIDS, JailSettings, VmJail
from .mapping import vm_record
from .memsource import MemorySource
from .poolwarm import PoolWarmer
from .records import VmRecord

RestoreSource = Template | SnapshotImage

log = logging.getLogger(__name__)
_NO_MEMORY = MemoryBacking(Path("/nonexistent"), share=False)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


class VmFactory:
    def __init__(
        self,
        run_dir: Path,
        hot: HotImages,
        slots: SlotPool,
        egress: EgressService,
        memory: MemorySource | None = None,
        jail: JailSettings | None = None,
        volume_warmup: Path | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.jail = jail
        self.warmer = PoolWarmer(volume_warmup)
        self._extra_uids = IndexAllocator(EXTRA_UIDS)
        self._extra: dict[str, int] = {}
        self.hot = hot
        self.memory = memory if memory is not None else MemorySource(hot, None, MemoryMode.HOT)
        self.slots = slots
        self.egress = egress
        self._egress_of: dict[str, str] = {}
        """vm id -> the sandbox whose policy its slot is served under."""
        self._seed_locks: dict[Path, asyncio.Lock] = {}
        self._leases: dict[str, Slot] = {}
        self._vms: dict[str, MicroVM] = {}
        """Every VM this factory made or adopted and has not destroyed (what maps hot copies)."""

    def mapped_hot_keys(self) -> set[str]:
        """The hot copies some live VM maps (never evicted)."""
        keys = (self.hot.key_of(vm.memory.path) for vm in self._vms.values())
        return {k for k in keys if k is not None}

    def slot_of(self, vm: MicroVM) -> Slot | None:
        """The network slot ``vm`` runs in (its guest is reachable at ``slot.address``)."""
        return self._leases.get(vm.vm_id)

    async def _attach(self, vm_id: str, machine: MachineConfig) -> NetAttach | None:
        if not machine.nic:
            return None
        slot = await self.slots.acquire()
        self._leases[vm_id] = slot
        return NetAttach(slot.netns, slot.tap)

    def _jail_for(self, vm_id: str, uid: int | None = None) -> VmJail | None:
        """The jail of a new (or, with ``uid``, an adopted) VM: a slot's uid, else one of the extra uids."""
        if self.jail is None:
            return None
        slot = self._leases.get(vm_id)
        if uid is None:
            if slot is not None:
                uid = self.jail.slot_uid(slot.index)
            else:
                index = self._extra[vm_id] = self._extra_uids.take()
                uid = self.jail.extra_uid(index)
        elif slot is None and uid >= self.jail.extra_uid(0):
            index = uid - self.jail.extra_uid(0)
            self._extra_uids.claim(index)
            self._extra[vm_id] = index
        return VmJail(self.jail, uid)

    async def apply_egress(
        self, vm: MicroVM, sandbox_id: str, policy: EgressPolicy | None, *, adopt: bool = False
    ) -> None:
        """Serve ``vm``'s slot under ``sandbox_id``'s policy (``None``: nothing allowed): its gate (or proxy) and
        name server start, or the policy in force is replaced; ``adopt``: a VM an earlier agent ran, whose guest's
        connections may still be open. :raises VmmError: the VM has no slot."""
        slot = self.slot_of(vm)
        if slot is None:
            raise VmmError(f"VM {vm.vm_id} has no network slot")
        wanted = policy if policy is not None else EgressPolicy()
        if self._egress_of.get(vm.vm_id) == sandbox_id:
            self.egress.update(sandbox_id, wanted)
            return
        await self.egress.attach(sandbox_id, slot.netns, wanted, adopt=adopt)
        self._egress_of[vm.vm_id] = sandbox_id

    async def forget_egress(self, sandbox_id: str) -> None:
        """The sandbox is gone: its decision log and policy go too."""
        await self.egress.forget(sandbox_id)

    async def _empty_overlay(self, template: Template) -> Path:
        """An empty overlay over the template's disk, made once per template; copies are ~200 KiB.

        Concurrent spawns share one creation (a lock per seed): copying a half-written qcow2 header gives a
        guest whose disk fails every read.
        """
        seed = self.run_dir / "overlays" / f"{template.name}-{template.generation}.qcow2"
        lock = self._seed_locks.setdefault(seed, asyncio.Lock())
        async with lock:
            if not seed.exists():
                await self._create_overlay(template, seed)
        return seed

    async def _create_overlay(self, template: Template, seed: Path) -> None:
        seed.parent.mkdir(parents=True, exist_ok=True)
        tmp = seed.with_name(f".{seed.name}.{new_id('tmp')}")
        argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(template.disk), str(tmp)]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise VmmError(f"qemu-img create failed: {out.decode(errors='replace')}")
        tmp.replace(seed)

    async def spawn_incoming(self, source: RestoreSource, *, lazy: bool = False) -> MicroVM:
        """A QEMU for ``source`` waiting for its state, with the guest-agent socket already connected
        (connecting before the state loads keeps the guest's port open across the restore). ``lazy`` pages its
        RAM from the memory server even when the image is local."""
        vm_id = new_id("vm")
        paths = VmPaths(self.run_dir / vm_id)
        paths.root.mkdir(parents=True)
        try:
            if isinstance(source, Template):
                shutil.copyfile(await self._empty_overlay(source), paths.disk)
            else:
                await asyncio.to_thread(clone_file, source.disk, paths.disk)
            memory = await self.memory.backing(source, lazy)
            net = await self._attach(vm_id, source.machine)
        except BaseException:
            shutil.rmtree(paths.root, ignore_errors=True)
            await self._release(vm_id)
            raise
        try:
            jail = self._jail_for(vm_id)
        except BaseException:
            shutil.rmtree(paths.root, ignore_errors=True)
            await self._release(vm_id)
            raise
        vm = MicroVM(vm_id, source.machine, paths, memory, paths.disk, net, jail)
        self._vms[vm_id] = vm
        try:
            await vm.start(incoming=True)
            await vm.connect_guest()
        except BaseException:
            await self.destroy(vm)
            raise
        return vm

    async def spawn_cold(self, machine: MachineConfig, disk: Path) -> MicroVM:
        """A VM that cold-boots from ``disk`` (moved into its run directory) with fresh RAM; returned running,
        its guest still booting."""
        vm_id = new_id("vm")
        paths = VmPaths(self.run_dir / vm_id)
        paths.root.mkdir(parents=True)
        os.replace(disk, paths.disk)
        memory = self.hot.path(vm_id)
        memory.parent.mkdir(parents=True, exist_ok=True)
        with open(memory, "wb") as fh:
            fh.truncate(machine.memory_mib << 20)
        vm = MicroVM(vm_id, machine, paths, MemoryBacking(memory, share=False), paths.disk)
        self._vms[vm_id] = vm
        try:
            vm.net = await self._attach(vm_id, machine)
            vm.jail = self._jail_for(vm_id)
        except BaseException:
            await self.destroy(vm)
            raise
        try:
            await vm.start(incoming=False)
            await vm.connect_guest()
        except BaseException:
            await self.destroy(vm)
            raise
        return vm

    async def warm(self, vm: MicroVM, template: Template) -> None:
        """Bring a pool VM's paths into QEMU's translation cache, then pause it (:meth:`.poolwarm.PoolWarmer.warm`);
        a VM whose warm-up fails is destroyed."""
        try:
            await self.warmer.warm(vm, template)
        except BaseException:
            await self.destroy(vm)
            raise

    def vm_record(self, vm: MicroVM) -> VmRecord:
        """What a later agent needs to adopt ``vm`` (see :mod:`.records`)."""
        slot = self.slot_of(vm)
        return vm_record(vm, slot, self.slots.plan.cidr if slot is not None else None)

    def adopt(self, record: VmRecord) -> MicroVM:
        """Hold the recorded QEMU (started by an earlier agent) and its network slot; its connections are made
        later (:meth:`MicroVM.reconnect`)."""
        net = NetAttach(record.netns, record.tap) if record.netns is not None else None
        origin = Path(record.memory_origin) if record.memory_origin is not None else None
        memory = MemoryBacking(Path(record.memory_path), record.memory_share, record.write_trackable, origin)
        vm = MicroVM.adopted(
            record.vm_id,
            MachineConfig.from_json(record.machine),
            VmPaths(Path(record.root)),
            memory,
            Path(record.disk),
            net,
            pid=record.pid,
            start_ticks=record.start_ticks,
        )
        if record.slot_index is not None:
            self._leases[vm.vm_id] = self.slots.adopt(record.slot_index)
        if record.uid is not None:
            vm.jail = self._jail_for(vm.vm_id, record.uid)
        self._vms[vm.vm_id] = vm
        return vm

    def placeholder(self, sandbox_id: str, machine: MachineConfig) -> MicroVM:
        """A VM object with no process, for a hibernated sandbox adopted from its record."""
        vm = MicroVM(f"vm-{sandbox_id}-hibernated", machine, VmPaths(self.run_dir / ".none"), _NO_MEMORY, Path())
        vm.state = VmState.KILLED
        return vm

    async def explain_failure(self, vm: MicroVM) -> CryoboxError | None:
        """A clearer cause for a VM that failed to come up (a chunk of its lazily paged RAM could not be
        fetched), if there is one."""
        return await self.memory.explain(vm)

    def set_background(self, vm: MicroVM, background: bool) -> None:
        """A pool QEMU's CPU weight while it warms (small) and once a create takes it (normal): see
        :meth:`~..vm.cgroups.CgroupHost.set_background`. Nothing without the jail's cgroups."""
        if self.jail is not None and self.jail.cgroups is not None and vm.jail is not None:
            self.jail.cgroups.set_background(vm.vm_id, background)

    def set_urgent(self, vm: MicroVM, urgent: bool) -> None:
        """A VM a request waits for gets a large CPU weight while it is adopted: see
        :meth:`~..vm.cgroups.CgroupHost.set_urgent`. Nothing without the jail's cgroups."""
        if self.jail is not None and self.jail.cgroups is not None and vm.jail is not None:
            self.jail.cgroups.set_urgent(vm.vm_id, urgent)

    async def destroy(self, vm: MicroVM) -> None:
        """Kill the VM and remove its run directory. Idempotent."""
        await vm.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(vm.paths.root)
        self.hot.drop(vm.vm_id)  # fresh RAM of a cold-booted VM (no-op for restored ones)
        await self._release(vm.vm_id)

    async def _release(self, vm_id: str) -> None:
        self._vms.pop(vm_id, None)
        extra = self._extra.pop(vm_id, None)
        if extra is not None:
            self._extra_uids.give(extra)
        owner = self._egress_of.pop(vm_id, None)
        if owner is not None:
            await self.egress.detach(owner)
        slot = self._leases.pop(vm_id, None)
        if slot is not None:
            await self.slots.release(slot)
