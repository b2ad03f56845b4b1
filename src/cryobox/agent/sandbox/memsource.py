"""Where a restore's RAM comes from: the host's hot copy on tmpfs, or the memory server (paged from the store).

``hot``: the image is local; it is copied once into tmpfs and every restore maps that copy (shared page cache;
userfaultfd can write-protect it; a snapshot of the VM is a layer over the image's copy on the volume).

``lazy``: the image stays in the object store; restores map the memory server's FUSE file and each chunk a guest
touches is fetched once per host (single-flight, durable chunk cache). A template fetched from the store has no
local memory file and is always lazy. Such a VM's RAM cannot be write-protected; its snapshots take the short
pause of :func:`~cryobox.agent.snapshot.shortpause.capture_whole` (the rest of the image is read from this file
after it). The file is named by the image's prefix and the sha256 the source's local manifest pins for its chunk
index (:func:`~cryobox.agent.memory.client.image_name`); a source whose manifest pins none is not paged from the
store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import CryoboxError, IntegrityError, VmmError
from ...objstore.keys import template_prefix
from ...util import procfs
from ..memory.client import MemoryServerProcess, image_name
from ..memory.hot import HotBudgetExceeded, HotImages
from ..memory.server.fusefs import prefix_of
from ..memory.settings import MemoryMode
from ..snapshot.store import SnapshotImage
from ..templates.bake import Template
from ..vm import MemoryBacking, MicroVM

log = logging.getLogger(__name__)


def vm_started_at(
    vm: MicroVM,
    proc: Path = procfs.PROC,
    boot_clock: Callable[[], float] = procfs.boot_clock,
    wall_clock: Callable[[], float] = time.time,
) -> float | None:
    """When ``vm``'s QEMU started, in seconds of ``CLOCK_BOOTTIME`` (the clock of the memory server's failure
    records): its ``/proc/<pid>/stat`` start time while the process (or its zombie) is there and still ours, else
    the mtime of its pidfile (QEMU writes it once, as it starts; a SIGBUS death leaves it), else ``None``."""
    pid = vm.pid
    if pid is not None:
        found = procfs.stat(pid, proc)
        argv = procfs.cmdline(pid, proc) if found is not None else None
        if found is not None and (found.state == "Z" or str(vm.paths.pidfile) in (argv or [])):
            return found.started_at
    try:
        mtime = os.stat(vm.paths.pidfile).st_mtime
    except OSError:
        return None
    return boot_clock() - max(0.0, wall_clock() - mtime)


class MemorySource:
    def __init__(
        self,
        hot: HotImages,
        memserver: MemoryServerProcess | None,
        mode: MemoryMode,
        prefetch: bool = True,
        started_at: Callable[[MicroVM], float | None] = vm_started_at,
    ) -> None:
        if mode is MemoryMode.LAZY and memserver is None:
            raise VmmError("lazy memory needs a memory server")
        self.hot = hot
        self.memserver = memserver
        self.mode = mode
        self.prefetch = prefetch
        self._started_at = started_at
        self._prefetched: set[str] = set()

    def prefix(self, source: Template | SnapshotImage, lazy: bool = False) -> str | None:
        """The store prefix ``source``'s RAM is paged from, or ``None`` when it maps a local hot copy."""
        if self.memserver is None:
            return None
        remote = source.manifest.get("memory_prefix")  # a template or snapshot fetched from the store
        if isinstance(remote, str) and not source.memory.exists():
            return remote
        if isinstance(source, Template) and (lazy or self.mode is MemoryMode.LAZY or not source.memory.exists()):
            return template_prefix(source.name, source.generation)
        return None

    def image_name(self, source: Template | SnapshotImage, lazy: bool = False) -> str | None:
        """The memory server's file name for ``source``'s RAM (its index pin included), or ``None`` when it maps a
        local hot copy.

        :raises IntegrityError: it would be paged from the store, but its manifest pins no hash for the index.
        """
        prefix = self.prefix(source, lazy)
        return None if prefix is None else image_name(source.manifest, prefix)

    async def backing(self, source: Template | SnapshotImage, lazy: bool = False) -> MemoryBacking:
        """The RAM file for a restore of ``source`` (``lazy`` forces the memory server, e.g. to record a trace).
        The first lazy restore of an image starts the replay of its prefetch trace."""
        name = self.image_name(source, lazy)
        if name is not None:
            assert self.memserver is not None
            if self.prefetch and not lazy and name not in self._prefetched:
                self._prefetched.add(name)
                try:
                    chunks = await self.memserver.prefetch(name)
                    log.info("prefetching %d chunks of %s", chunks, name)
                except Exception as err:  # prefetch is an optimisation: the restore faults chunks in anyway
                    log.warning("prefetch of %s did not start: %s", name, err)
            return MemoryBacking(self.memserver.path_for(name), share=False, write_trackable=False)
        if not source.memory.exists() and not self.hot.path(source.hot_key).exists():
            # (a snapshot still being made durable has only its hot copy: fork_tree children restore from it)
            raise VmmError(f"{source.path} has no memory image here and none in the object store")
        try:
            hot = await self.hot.ensure(source.hot_key, source.memory)
            return MemoryBacking(hot, share=False, origin=source.memory)
        except HotBudgetExceeded as full:
            if self.memserver is None or not isinstance(source, Template):
                raise
            try:
                name = image_name(source.manifest, template_prefix(source.name, source.generation))
            except IntegrityError as err:  # no pin to page it with: the restore waits for hot memory as before
                log.warning("hot memory is full and %s cannot page from the memory server: %s", source.name, err)
                raise full from err
            log.warning("hot memory is full: %s pages from the memory server instead", source.name)
            return MemoryBacking(self.memserver.path_for(name), share=False, write_trackable=False)

    async def explain(self, vm: MicroVM) -> CryoboxError | None:
        """Why a lazily paged VM died, if the memory server recorded a failed chunk fetch for its image since the
        VM started (an older failure, before this VM existed, is not its cause)."""
        if self.memserver is None or vm.memory.write_trackable:
            return None
        mount = self.memserver.config.mount
        if vm.memory.path.parent != mount:
            return None
        name = vm.memory.path.name
        prefix = prefix_of(name)
        since = self._started_at(vm)
        if since is None:
            log.warning("could not tell when %s started; any recorded failure of %s may be older", vm.vm_id, prefix)
        try:
            return await self.memserver.failure(name, since)
        except Exception as err:  # the memory server itself is gone: say so rather than hide the first error
            log.warning("could not ask the memory server about %s: %s", prefix, err)
            return None
