"""A pool VM's warm-up: what its first request would otherwise pay under TCG, paid before it waits in the pool.

Under TCG every guest code path runs translated, and the first run of a path in a new QEMU process pays for its
translation. A pool VM is a new QEMU, so before it waits (paused) it runs, once each: an ``exec true`` (the exec
path), a login shell started as E2B's SDKs start every command (``/bin/bash -l -c CMD`` as ``user``; the
process is forgotten when it ends), and the ``resume``
sequence a create runs at hand-out — with volume slots, mounting a throwaway volume (:mod:`..vm.volumewarm`).
That ``resume`` is done as the instance the VM becomes (``MicroVM.rejoined_as``): the create's own keeps its
neighbour and resolver flushes, its reseed and its instance id (:mod:`cryobox.guest.ops_resume`, ``rejoined``).
Nothing else of it stays visible to the sandbox the VM becomes: no listed process, no mount, no file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from ...errors import CryoboxError, VmmError
from ..guest.client import GuestClient
from ..guest.exec import run_exec
from ..templates.bake import Template
from ..vm import MicroVM
from ..vm.volumes import attach_fd, detach_volumes
from ..vm.volumewarm import WARMUP_MOUNT, WarmupData, private_copy, warmup_volume
from .fidelity import rejoin

log = logging.getLogger(__name__)

LOGIN_SHELL: dict[str, Any] = {
    "cmd": "/bin/bash",
    "args": ["-l", "-c", "true"],
    "default_user": "user",  # E2B's default account
    "attach": True,
    "forget": True,  # not listed in the sandbox this VM becomes
}
"""What E2B's SDKs run for every command, started as they start it (a process, not an ``exec``). Its first run in
a new QEMU translates bash, the profile scripts and the guest's process path: measured, E2B's create + first
``commands.run("true")`` took 271 ms p50 (the command 213 ms of it, later ones ~55 ms); with an ``exec`` of the
same shell in the warm-up 177 ms, with this 148 ms."""


async def warm_login_shell(guest: GuestClient) -> None:
    """Run :data:`LOGIN_SHELL` to its end; an image without bash or without that account just stays cold for it.
    One still running after a minute fails the warm-up (the VM is destroyed, not pooled with a process in it)."""
    try:
        async with asyncio.timeout(60):
            async for _ in guest.stream("proc_start", LOGIN_SHELL):
                pass
    except CryoboxError as err:
        log.debug("login shell warm-up skipped: %s", err)


class PoolWarmer:
    """Warms pool VMs; holds the volume warm-up image (``None``: no volume warm-up) and its data, read once."""

    def __init__(self, volume_image: Path | None) -> None:
        self.volume_image = volume_image
        self._volume_data: WarmupData | None = None

    async def warm(self, vm: MicroVM, template: Template) -> None:
        """Load the template's state, run the warm-up steps and leave the VM paused (raises if a step fails)."""
        await vm.restore(template.vmstate)
        guest = await vm.connect_guest()
        await run_exec(guest, "true", timeout_s=60)
        await warm_login_shell(guest)
        if self.volume_image is not None and vm.config.rw_volume_slots:
            if self._volume_data is None:  # read once, in a thread (a few hundred KiB of 16 MiB)
                self._volume_data = await asyncio.to_thread(WarmupData.read, self.volume_image)
            await warm_volumes(vm, self.volume_image, self._volume_data)
        else:
            # translates the rejoin path, and does what a hand-out need not redo (the VM stays in this slot and
            # is not cloned again): the create's rejoin keeps its names and identity
            instance_id = uuid.uuid4().hex
            await rejoin(guest, instance_id, run_hooks=False)
            await vm.pause()
            vm.rejoined_as = instance_id


async def warm_volumes(vm: MicroVM, image: Path, data: WarmupData) -> None:
    """The rejoin of :meth:`PoolWarmer.warm` with a volume mounted, unmounted and detached again; ends paused."""
    await vm.pause()
    fd = private_copy(data)  # a memfd and a few writes
    try:
        await attach_fd(vm, fd, warmup_volume(image))
    finally:
        os.close(fd)
    await vm.resume()
    guest = await vm.connect_guest()
    instance_id = uuid.uuid4().hex
    await rejoin(guest, instance_id, run_hooks=False, volumes=vm.volumes)
    reply = await guest.call("volumes_settle", {"paths": [WARMUP_MOUNT], "mode": "unmount"}, timeout=60)
    if reply.get("errors"):
        raise VmmError(f"the volume warm-up did not unmount: {reply['errors']}")
    await guest.call("delete", {"path": WARMUP_MOUNT}, timeout=60)
    await vm.pause()
    await detach_volumes(vm)
    vm.rejoined_as = instance_id
