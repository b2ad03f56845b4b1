"""Where a restore's RAM comes from: the host's hot copy on tmpfs, or the memory server (paged from the store).

``hot``: the image is local; it is copied once into tmpfs and every restore maps that copy (userfaultfd can
write-protect it, so a running sandbox snapshots with a ~30 ms pause).

``lazy``: the image stays in the object store; restores map the memory server's FUSE file and each chunk a guest
touches is fetched once per host (single-flight, durable chunk cache). A template fetched from the store has no
local memory file and is always lazy. Such a VM's RAM cannot be write-protected, so its snapshots pause it for a
plain migration.
"""

from __future__ import annotations

import logging

from ..errors import CryoboxError, VmmError
from .storage import MemoryMode
from .store.fusefs import prefix_of
from .store.hot import HotImages
from .store.memclient import MemoryServerProcess
from .store.publish import template_prefix
from .store.snapshots import SnapshotImage
from .templates import Template
from .vm import MemoryBacking, MicroVM

log = logging.getLogger(__name__)


class MemorySource:
    def __init__(
        self, hot: HotImages, memserver: MemoryServerProcess | None, mode: MemoryMode, prefetch: bool = True
    ) -> None:
        if mode is MemoryMode.LAZY and memserver is None:
            raise VmmError("lazy memory needs a memory server")
        self.hot = hot
        self.memserver = memserver
        self.mode = mode
        self.prefetch = prefetch
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

    async def backing(self, source: Template | SnapshotImage, lazy: bool = False) -> MemoryBacking:
        """The RAM file for a restore of ``source`` (``lazy`` forces the memory server, e.g. to record a trace).
        The first lazy restore of an image starts the replay of its prefetch trace."""
        prefix = self.prefix(source, lazy)
        if prefix is not None:
            assert self.memserver is not None
            if self.prefetch and not lazy and prefix not in self._prefetched:
                self._prefetched.add(prefix)
                try:
                    chunks = await self.memserver.prefetch(prefix)
                    log.info("prefetching %d chunks of %s", chunks, prefix)
                except Exception as err:  # prefetch is an optimisation: the restore faults chunks in anyway
                    log.warning("prefetch of %s did not start: %s", prefix, err)
            return MemoryBacking(self.memserver.path_for(prefix), share=False, write_trackable=False)
        if not source.memory.exists() and not self.hot.path(source.hot_key).exists():
            # (a snapshot still being made durable has only its hot copy: fork_tree children restore from it)
            raise VmmError(f"{source.path} has no memory image here and none in the object store")
        return MemoryBacking(await self.hot.ensure(source.hot_key, source.memory), share=False)

    async def explain(self, vm: MicroVM) -> CryoboxError | None:
        """Why a lazily paged VM died, if the memory server recorded a failed chunk fetch for its image."""
        if self.memserver is None or vm.memory.write_trackable:
            return None
        mount = self.memserver.config.mount
        if vm.memory.path.parent != mount:
            return None
        prefix = prefix_of(vm.memory.path.name)
        try:
            return await self.memserver.failure(prefix)
        except Exception as err:  # the memory server itself is gone: say so rather than hide the first error
            log.warning("could not ask the memory server about %s: %s", prefix, err)
            return None
