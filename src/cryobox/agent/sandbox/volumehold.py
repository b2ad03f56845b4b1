"""A running sandbox's volumes let go of around a capture, and volumes joining a guest that booted cold.

**Released for a capture.** A snapshot records a sandbox's mounts, not its volumes' bytes: before
:mod:`.forking` captures a VM with volumes, the guest agent's ``volumes_release`` syncs and unmounts each one (a
plain umount(2), never lazy) and claims its disk exclusively, so the captured memory holds no state of those file
systems; a restore mounts whatever the volume holds by then. A volume in use (EBUSY: a process's working directory
or open file on it, or its file system mounted elsewhere too) is a 409 ``volume_busy`` naming the path, and the
guest mounted again what it had let go of: the sandbox is as it was. After the capture the guest mounts them again
(``volumes_mount``, the same mount(2) as a create's ``resume``). A paused sandbox cannot run its guest to let go:
a 409 (resume it first).

**Joining a cold boot.** A fork child boots from a copy of its parent's disk, its slots empty: once its guest
answers, the VM is paused, the slots pointed at its volumes (:func:`..vm.volumes.attach_volumes`, as for a
restore), and the vCPUs continued; the guest mounts them in the ``resume`` that makes it rejoin the world.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ...errors import StateError
from ..vm import MicroVM, VmState
from ..vm.volumes import VolumeAttach, attach_volumes
from .fidelity import check_mounts

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 60.0
"""A release syncs: with much dirty data in the guest's page cache that takes a while."""
MOUNT_TIMEOUT_S = 30.0


def _mounts(vm: MicroVM) -> list[dict[str, Any]]:
    return [m for m in (v.guest_mount() for v in vm.volumes) if m is not None]


def _disks(vm: MicroVM) -> list[dict[str, Any]]:
    """The volumes the platform attached without mounting them: only their disks are checked."""
    return [
        {"serial": v.serial, "device": v.device.removeprefix("/dev/"), "sectors": v.size_bytes // 512}
        for v in vm.volumes
        if v.mount_path is None
    ]


def busy_error(sandbox_id: str, reply: dict[str, Any]) -> StateError:
    """The 409 for a ``volumes_release`` that failed (``reply``: the guest's answer)."""
    path, device, error = reply.get("path"), reply.get("device"), reply.get("error")
    if path and reply.get("step") == "umount":
        message = (
            f"the volume at {path} is in use in sandbox {sandbox_id} ({error}): a process has its working "
            f"directory or a file open under {path}. Stop that process or move it out of {path}, then snapshot "
            "again (a snapshot records the volume's mount, not its bytes: the guest unmounts it for the capture)"
        )
    else:
        where = f"the volume at {path}" if path else f"the volume disk /dev/{device}"
        message = (
            f"{where} is still in use in sandbox {sandbox_id} ({error}): its file system is mounted elsewhere "
            "too (a bind mount or another mount namespace) or its disk is held. Unmount it there, then snapshot "
            "again"
        )
    return StateError(
        message,
        state="volume_busy",
        required="volumes not in use",
        details={"path": path, "device": device, "error": error},
    )


async def release_volumes(vm: MicroVM, sandbox_id: str) -> list[dict[str, Any]]:
    """Have ``vm``'s guest let go of its volumes; returns the mounts to make again after the capture (those it
    unmounted). :raises StateError: ``volume_busy`` (the guest mounted again what it had unmounted)."""
    if vm.state is not VmState.RUNNING:
        raise StateError(
            f"sandbox {sandbox_id} is {vm.state.value} with volumes attached: resume it to snapshot or fork it "
            "(its guest unmounts them for the capture)",
            state=vm.state.value,
            required="running",
        )
    mounts = _mounts(vm)
    started = time.monotonic()
    guest = await vm.connect_guest()
    reply = await guest.call("volumes_release", {"volumes": mounts, "disks": _disks(vm)}, timeout=RELEASE_TIMEOUT_S)
    if not reply.get("ok"):
        if reply.get("remount_errors"):
            log.error("sandbox %s: volumes not mounted again after a refused release: %s", sandbox_id, reply)
        raise busy_error(sandbox_id, reply)
    released = set(reply.get("released") or [])
    log.info(
        "sandbox %s: %d volumes released in %.1f ms (guest %.1f ms)",
        sandbox_id,
        len(vm.volumes),
        (time.monotonic() - started) * 1000,
        float(reply.get("ms") or 0.0),
    )
    return [m for m in mounts if m["path"] in released]


async def remount_volumes(vm: MicroVM, mounts: Sequence[dict[str, Any]]) -> None:
    """Mount ``mounts`` (what :func:`release_volumes` returned) again. :raises StateError: one did not mount."""
    if not mounts:
        return
    guest = await vm.connect_guest()
    reply = await guest.call("volumes_mount", {"volumes": list(mounts)}, timeout=MOUNT_TIMEOUT_S)
    check_mounts(list(mounts), reply)


async def join_booted(vm: MicroVM, volumes: Sequence[VolumeAttach]) -> None:
    """Point the slots of ``vm`` (booted cold, its guest answering) at ``volumes``: paused for the attach, then
    continued; its guest sees their capacities and mounts them in its next ``resume``."""
    if not volumes:
        return
    await vm.pause()
    try:
        await attach_volumes(vm, volumes)
    finally:
        await vm.resume()
