"""Attaching volumes to a restored VM: a baked, empty slot (:mod:`.slots`) is pointed at a volume image before the
guest's vCPUs run, and the guest agent mounts it in the same call that makes the guest rejoin the world.

For each volume, while the vCPUs are stopped (after ``migrate-incoming`` completed, or a warm pool VM paused)::

    add-fd          the image, opened here (O_RDWR, or O_RDONLY for a read-only slot): QEMU opens no path of ours
    blockdev-add    raw over file /dev/fdset/N, cache=writeback (no O_DIRECT, flushes honoured), discard=unmap
    remove-fd       the node holds its own copy; the set goes with the node
    qom-set         <slot> drive = doorbell   a memfd node: QEMU resizes no read-only node, and we never want a
    block_resize    doorbell = image size     tenant's image truncated; the resize is what raises the
                                              virtio config-change interrupt (the guest re-reads the capacity)
    qom-set         <slot> drive = volume     the capacity the guest reads on that interrupt is the volume's

``blockdev-change-medium`` and ``x-blockdev-change`` do not work on virtio-blk; ``qom-set drive`` on a realized
device replaces its BlockBackend's node (QEMU 6.0+, ``realized_set_allowed``). The doorbell is one memfd node per
VM, made once (:func:`ensure_doorbell`: a warm pool VM has it already). Everything after ``add-fd`` is sent in one
go (:func:`_pipeline`), ``add-fd`` too (the set's id is ours: :meth:`~.microvm.MicroVM.stage_fd`): one QMP round
trip per volume.

**Durability.** ``cache.direct=off, no-flush=off`` and a raw image: a write the guest completed is in the host's
page cache (QEMU keeps no buffers of its own for raw), so it survives a SIGKILL of QEMU (and of the agent, which
holds none of it); a guest ``fsync`` becomes a virtio flush and then an ``fdatasync`` of the image, so it also
survives a host crash. The root disk's ``cache=unsafe`` (flushes ignored) is never used for volumes.

**One writer.** QEMU's image locking (OFD locks on the image) stays on: a second QEMU cannot attach an image
another holds read-write, nor attach read-write one that others hold read-only; that is a
:class:`~cryobox.errors.StateError`.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidArgument, NotFound, StateError, VmmError
from ...util.procfs import cmdline, holders
from .slots import VolumeSlot
from .states import VmState

if TYPE_CHECKING:
    from .machine import MachineConfig
    from .microvm import MicroVM

DOORBELL = "vol-doorbell"
SECTOR = 512
MAX_MOUNT_PATH = 1024
FORBIDDEN_MOUNTS = ("/proc", "/sys", "/dev", "/run/cryobox")
"""Mount points a volume may not cover (or sit under): what the guest agent and the kernel interfaces live on."""
LOCKED = ('Failed to get "write" lock', 'Failed to get shared "write" lock', 'Failed to get "consistent read" lock')


def check_mount_path(path: str) -> str:
    """``path`` if a volume may be mounted there in the guest: absolute, normalised, not ``/`` and not on the
    guest's kernel or agent interfaces. :raises InvalidArgument: naming the path."""
    if (
        not path.startswith("/")
        or "\0" in path
        or "\n" in path
        or len(path.encode()) > MAX_MOUNT_PATH
        or posixpath.normpath(path) != path
        or path == "/"
        or path.startswith("//")
    ):
        raise InvalidArgument(
            f"volume mount path {path!r} must be an absolute, normalised path other than / (at most "
            f"{MAX_MOUNT_PATH} bytes)",
            details={"field": "path", "path": path},
        )
    for forbidden in FORBIDDEN_MOUNTS:
        if path == forbidden or path.startswith(forbidden + "/"):
            raise InvalidArgument(f"a volume cannot be mounted on {path} (under {forbidden})", details={"path": path})
    return path


@dataclass(frozen=True)
class VolumeAttach:
    """One volume to join a restored guest: its image on this host and how the guest gets it."""

    path: Path
    """The raw image (an ext4 filesystem for a mounted one). The agent opens it and hands QEMU the descriptor."""
    read_only: bool = False
    """A read-only slot: QEMU opens the image read-only and the guest's kernel refuses writes to the device."""
    mount_path: str | None = None
    """Where the guest agent mounts it (ext4; ``nosuid,nodev``, plus ``ro,noload`` when read-only); ``None``:
    the guest only gets the block device."""
    name: str = ""
    """The volume's name, for messages."""

    def __post_init__(self) -> None:
        if self.mount_path is not None:
            check_mount_path(self.mount_path)

    @property
    def label(self) -> str:
        return self.name or self.path.name


@dataclass(frozen=True)
class AttachedVolume:
    """A volume a VM's slot points at."""

    slot: str
    serial: str
    device: str
    """The guest's device (``/dev/vdc``) when the VM has no data disks (the guest agent finds it by serial)."""
    path: str
    read_only: bool
    mount_path: str | None
    size_bytes: int
    name: str = ""

    def guest_mount(self) -> dict[str, Any] | None:
        """What the guest agent's ``resume`` needs to mount it (``None``: not mounted by the platform)."""
        if self.mount_path is None:
            return None
        return {
            "serial": self.serial,
            "device": self.device.removeprefix("/dev/"),
            "sectors": self.size_bytes // SECTOR,
            "path": self.mount_path,
            "read_only": self.read_only,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttachedVolume:
        return cls(**data)


def assign_slots(config: MachineConfig, volumes: Sequence[VolumeAttach]) -> list[tuple[VolumeSlot, VolumeAttach]]:
    """Read-write volumes to the read-write slots, read-only ones to the read-only slots, in order.

    :raises InvalidArgument: more volumes of a kind than the machine has slots, or one mount path twice.
    """
    paths = [v.mount_path for v in volumes if v.mount_path is not None]
    if len(set(paths)) != len(paths):
        raise InvalidArgument("two volumes cannot be mounted at the same path", details={"paths": paths})
    pairs: list[tuple[VolumeSlot, VolumeAttach]] = []
    for read_only in (False, True):
        wanted = [v for v in volumes if v.read_only is read_only]
        slots = [s for s in config.volume_slots if s.read_only is read_only]
        if len(wanted) > len(slots):
            kind = "read-only" if read_only else "read-write"
            raise InvalidArgument(
                f"at most {len(slots)} {kind} volumes per sandbox (asked for {len(wanted)})",
                details={"field": "volumes", "limit": len(slots)},
            )
        pairs += zip(slots, wanted, strict=False)
    return pairs


def _open_image(volume: VolumeAttach) -> tuple[int, int]:
    """The image opened for QEMU (no symlink followed) and its size. :raises NotFound, InvalidArgument:"""
    flags = (os.O_RDONLY if volume.read_only else os.O_RDWR) | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(volume.path, flags)
    except FileNotFoundError:
        raise NotFound(f"volume {volume.label} has no image on this host", details={"volume": volume.label}) from None
    except OSError as err:
        raise VmmError(f"cannot open the image of volume {volume.label}: {err}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= 0 or info.st_size % SECTOR:
            raise InvalidArgument(
                f"the image of volume {volume.label} is not a regular file of whole {SECTOR}-byte sectors",
                details={"volume": volume.label},
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _cache() -> dict[str, bool]:
    return {"direct": False, "no-flush": False}


async def ensure_doorbell(vm: MicroVM) -> None:
    """Give ``vm`` its doorbell (once; kept for the VM's life): a writable, resizable node of nothing, a memfd
    (sparse, never read), which rings the capacity change. A pool VM gets it while it is prepared, so a create
    does not pay for it."""
    if vm.volume_doorbell:
        return
    fd = os.memfd_create("cryobox-volume-doorbell", os.MFD_CLOEXEC)
    try:
        fdset = await vm.add_fd(fd, DOORBELL)
    finally:
        os.close(fd)
    node = {"driver": "raw", "node-name": DOORBELL, "file": {"driver": "file", "filename": f"/dev/fdset/{fdset}"}}
    await _pipeline(vm, [("blockdev-add", node), ("remove-fd", {"fdset-id": fdset})])
    vm.volume_doorbell = True


async def _pipeline(vm: MicroVM, commands: Sequence[tuple[str, dict[str, Any]]], label: str = "") -> None:
    """Send ``commands`` without waiting for each reply (QEMU runs them in order; one round trip in all, not
    one each); raises the first failure (a lock held elsewhere: :class:`StateError`)."""
    tasks = [asyncio.ensure_future(vm.execute(command, arguments)) for command, arguments in commands]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, VmmError) and any(marker in result.message for marker in LOCKED):
            raise StateError(
                f"volume {label} is attached to another sandbox", state="attached", required="detached"
            ) from result
        if isinstance(result, BaseException):
            raise result


def _ring(slot: VolumeSlot, size: int) -> list[tuple[str, dict[str, Any]]]:
    """Make the guest re-read ``slot``'s capacity when it runs: the doorbell, resized to ``size``, raises the
    config-change interrupt; the capacity the guest then reads is that of the node the slot points at next."""
    return [
        ("qom-set", {"path": slot.qom_path, "property": "drive", "value": DOORBELL}),
        ("block_resize", {"node-name": DOORBELL, "size": size}),
    ]


async def _plug(vm: MicroVM, slot: VolumeSlot, fd: int, size: int, read_only: bool, label: str) -> None:
    """Point ``slot`` at the raw image open as ``fd`` (``size`` bytes): one round trip."""
    fdset, add_fd = vm.stage_fd(fd, slot.volume_node)
    volume = {
        "driver": "raw",
        "node-name": slot.volume_node,
        "read-only": read_only,
        "discard": "unmap",
        "cache": _cache(),
        "file": {"driver": "file", "filename": f"/dev/fdset/{fdset}", "cache": _cache(), "locking": "on"},
    }
    await _pipeline(
        vm,
        [
            add_fd,
            ("blockdev-add", volume),
            ("remove-fd", {"fdset-id": fdset}),  # the node holds its own copy; the set goes with the node
            *_ring(slot, size),
            ("qom-set", {"path": slot.qom_path, "property": "drive", "value": slot.volume_node}),
        ],
        label,
    )


def _attached(vm: MicroVM, slot: VolumeSlot, volume: VolumeAttach, size: int) -> AttachedVolume:
    return AttachedVolume(
        slot=slot.id,
        serial=slot.serial,
        device=f"/dev/{vm.config.slot_device(slot)}",
        path=str(volume.path),
        read_only=volume.read_only,
        mount_path=volume.mount_path,
        size_bytes=size,
        name=volume.name,
    )


def _require_stopped(vm: MicroVM) -> None:
    if vm.state not in (VmState.INCOMING, VmState.PAUSED):
        raise StateError(f"volumes join a VM whose vCPUs are stopped, not a {vm.state.value} one", state=vm.state.value)
    if vm.volumes:
        raise StateError(f"VM {vm.vm_id} has volumes attached already", state="attached")


async def attach_volumes(vm: MicroVM, volumes: Sequence[VolumeAttach]) -> tuple[AttachedVolume, ...]:
    """Point ``vm``'s slots at ``volumes`` while its vCPUs are stopped (its state loaded, or a paused warm VM);
    the guest sees each one's capacity when it continues. Records them in ``vm.volumes``.

    :raises StateError: the VM runs, already has volumes, or an image is attached read-write elsewhere.
    :raises InvalidArgument: more volumes than slots, a duplicate mount path, an image that is not a raw file.
    :raises NotFound: an image does not exist.
    """
    _require_stopped(vm)
    pairs = assign_slots(vm.config, volumes)
    if not pairs:
        return ()
    await ensure_doorbell(vm)
    attached: list[AttachedVolume] = []
    try:
        for slot, volume in pairs:
            fd, size = _open_image(volume)  # a local open and fstat: not worth a thread hop on the create path
            try:
                await _plug(vm, slot, fd, size, volume.read_only, volume.label)
            except StateError:
                held_by = [pid for pid in await asyncio.to_thread(holders, volume.path) if pid != os.getpid()]
                vm.log.warning(
                    "VM %s: volume %s (%s) is locked by another process: %s",
                    vm.vm_id,
                    volume.label,
                    volume.path,
                    "; ".join(f"pid {pid}: {' '.join((cmdline(pid) or [])[:12])}" for pid in held_by) or "none now",
                )
                raise
            finally:
                os.close(fd)
            attached.append(_attached(vm, slot, volume, size))
    finally:
        vm.volumes = tuple(attached)
    return vm.volumes


async def attach_fd(vm: MicroVM, fd: int, volume: VolumeAttach) -> AttachedVolume:
    """Point ``vm``'s last slot of ``volume``'s kind at the raw image open as ``fd`` (``volume.path`` only names
    it): a pool VM's warm-up image (:mod:`.volumewarm`). Detached with :func:`detach_volumes`."""
    _require_stopped(vm)
    slot = [s for s in vm.config.volume_slots if s.read_only is volume.read_only][-1]
    size = os.fstat(fd).st_size
    await ensure_doorbell(vm)
    await _plug(vm, slot, fd, size, volume.read_only, volume.label)
    vm.volumes = (_attached(vm, slot, volume, size),)
    return vm.volumes[0]


async def detach_volumes(vm: MicroVM) -> None:
    """Point every slot that has a volume back at its empty node, the guest told its capacity is 0 again, and
    close the images: for a paused VM whose guest unmounted them (a pool VM after its warm-up)."""
    if vm.state is not VmState.PAUSED:
        raise StateError(f"volumes leave a paused VM, not a {vm.state.value} one", state=vm.state.value)
    slots = {s.id: s for s in vm.config.volume_slots}
    commands: list[tuple[str, dict[str, Any]]] = []
    for volume in vm.volumes:
        slot = slots[volume.slot]
        commands += [
            *_ring(slot, 0),
            ("qom-set", {"path": slot.qom_path, "property": "drive", "value": slot.empty_node}),
            ("blockdev-del", {"node-name": slot.volume_node}),
        ]
    vm.volumes = ()
    await _pipeline(vm, commands)


SETTLE_TIMEOUT_S = 10.0


async def settle_volumes(vm: MicroVM, timeout: float = SETTLE_TIMEOUT_S) -> dict[str, Any]:
    """Before ``vm`` is killed and its volumes kept: have the guest sync and freeze each read-write volume it
    mounted, so the image is clean (journal checkpointed) without a replay. Best effort: a guest that does not
    answer within ``timeout`` loses only writes it never fsynced. Returns the guest's report (``{}``: nothing to
    do or no answer)."""
    paths = [v.mount_path for v in vm.volumes if v.mount_path is not None and not v.read_only]
    if not paths or vm.state is not VmState.RUNNING or not vm.alive():
        return {}
    try:
        async with asyncio.timeout(timeout):
            guest = await vm.connect_guest(timeout)
            reply: dict[str, Any] = await guest.call("volumes_settle", {"paths": paths, "mode": "freeze"})
    except Exception as err:  # best effort: whatever the guest did, the kill goes ahead
        vm.log.warning("VM %s: its volumes were not settled before the kill (%r)", vm.vm_id, err)
        return {}
    if reply.get("errors"):
        vm.log.warning("VM %s: volumes not settled: %s", vm.vm_id, reply["errors"])
    return reply
