"""The interface's volume methods, mixed into :class:`~.agent.HostAgent`: this host's volume images
(:mod:`..volumes.store`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping, Sequence

from ...agentapi.models_volumes import (
    ChildVolume,
    StoredVolume,
    VolumeFetch,
    VolumeInfo,
    VolumeMount,
    VolumeResize,
    VolumeSpec,
)
from ...errors import HostUnavailable, NotFound, ObjectNotFound
from ..host.startup import Host
from ..sandbox.sandbox import Sandbox, SandboxState
from ..vm.volumes import VolumeAttach
from ..volumes.clones import VolumeClone
from ..volumes.store import VolumeStore
from ..volumes.transfer import fetch_volume, store_volume

log = logging.getLogger(__name__)


class VolumeEndpoints:
    host: Host

    @property
    def _volumes(self) -> VolumeStore:
        if self.host.volumes is None:
            raise HostUnavailable("this agent holds no volumes (it runs without a volume store)")
        return self.host.volumes

    def volume_attaches(self, mounts: Sequence[VolumeMount]) -> list[VolumeAttach]:
        """What the VM code attaches for a create's ``mounts`` (each image must be on this host: 404 otherwise)."""
        if not mounts:
            return []
        store = self._volumes
        out = []
        for mount in mounts:
            store.info(mount.volume_id)  # 404: not here
            out.append(
                VolumeAttach(
                    path=store.path(mount.volume_id),
                    read_only=mount.read_only,
                    mount_path=mount.path,
                    name=mount.volume_id,
                )
            )
        return out

    def fork_volumes(
        self, wanted: Mapping[str, Sequence[ChildVolume]]
    ) -> tuple[dict[str, list[VolumeAttach]], dict[str, list[VolumeClone]]]:
        """Per fork child id, what it attaches and the clones to make for it. 404: a volume or a clone's source
        is not on this host; 409: a clone's image exists already; 503: no room for every clone's full size."""
        volumes: dict[str, list[VolumeAttach]] = {}
        clones: dict[str, list[VolumeClone]] = {}
        for child_id, asked in wanted.items():
            volumes[child_id], clones[child_id] = self._child_volumes(asked)
        every = [clone for made in clones.values() for clone in made]
        if every:
            self._volumes.room_for(sum(c.source.stat().st_size for c in every))
        return volumes, clones

    def _child_volumes(self, volumes: Sequence[ChildVolume]) -> tuple[list[VolumeAttach], list[VolumeClone]]:
        if not volumes:
            return [], []
        attaches = self.volume_attaches([v for v in volumes if v.clone_of is None])
        clones: list[VolumeClone] = []
        store = self._volumes
        for volume in volumes:
            if volume.clone_of is None:
                continue
            store.info(volume.clone_of)  # 404: the source is not here
            clone = VolumeClone(source=store.path(volume.clone_of), target=store.new_path(volume.volume_id))
            clones.append(clone)
            attaches.append(VolumeAttach(clone.target, volume.read_only, volume.path, volume.volume_id))
        return attaches, clones

    async def list_volumes(self) -> list[VolumeInfo]:
        store = self._volumes
        return [store.info(volume_id) for volume_id in store.ids()]

    async def create_volume(self, spec: VolumeSpec) -> VolumeInfo:
        return await self._volumes.create(spec)

    async def volume_info(self, volume_id: str) -> VolumeInfo:
        return self._volumes.info(volume_id)

    async def resize_volume(self, volume_id: str, request: VolumeResize) -> VolumeInfo:
        return self._volumes.grow(volume_id, request.size_bytes)

    async def delete_volume(self, volume_id: str) -> None:
        self._volumes.delete(volume_id, in_use=self._attached_here(volume_id))

    def _attached_here(self, volume_id: str) -> bool:
        """Whether a sandbox of this host has the volume's image attached (its VM may write it)."""
        return bool(self._holders_here(volume_id))

    def _holders_here(self, volume_id: str) -> list[Sandbox]:
        path = str(self._volumes.path(volume_id))
        return [sb for sb in self.host.service.sandboxes.values() if any(v.path == path for v in sb.volumes)]

    @functools.cached_property
    def _moving(self) -> dict[str, asyncio.Lock]:
        return {}

    def _volume_lock(self, volume_id: str) -> asyncio.Lock:
        return self._moving.setdefault(volume_id, asyncio.Lock())

    async def store_volume(self, volume_id: str) -> StoredVolume:
        store = self._volumes
        async with self._volume_lock(volume_id), contextlib.AsyncExitStack() as held:
            store.info(volume_id)  # 404: not here
            holders = sorted(self._holders_here(volume_id), key=lambda sb: sb.id)
            for sandbox in holders:  # hibernated holders (a drain) stay so while it is read: no VM writes it
                await held.enter_async_context(sandbox.lock)
            now = self._holders_here(volume_id)
            if {id(sb) for sb in now} != {id(sb) for sb in holders} or any(
                sb.state is not SandboxState.HIBERNATED for sb in now
            ):
                store.delete(volume_id, in_use=True)  # raises the 409: a VM may write it
            stored = await asyncio.to_thread(store_volume, self.host.store, volume_id, store.path(volume_id))
        log.info(
            "volume %s stored as %s: %d of %d bytes uploaded in %.1f s",
            volume_id,
            stored.key,
            stored.uploaded_bytes,
            stored.stored_bytes,
            stored.seconds,
        )
        return stored

    async def fetch_volume(self, request: VolumeFetch) -> VolumeInfo:
        store = self._volumes
        volume_id = request.volume_id
        async with self._volume_lock(volume_id):
            if self._attached_here(volume_id):
                store.delete(volume_id, in_use=True)  # raises the 409: never replace an image a VM has
            store.root.mkdir(parents=True, exist_ok=True)
            try:
                size = await asyncio.to_thread(
                    fetch_volume,
                    self.host.store,
                    volume_id,
                    request.manifest_sha256,
                    store.path(volume_id),
                    store.room_for,
                )
            except ObjectNotFound:
                raise NotFound(
                    f"volume {volume_id} has no stored image in the object store", details={"volume_id": volume_id}
                ) from None
        log.info("volume %s (%d bytes) fetched from the object store", volume_id, size)
        return store.info(volume_id)
