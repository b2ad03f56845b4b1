"""The interface's volume methods, mixed into :class:`~.agent.HostAgent`: this host's volume images
(:mod:`..volumes.store`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...agentapi.models_volumes import ChildVolume, VolumeInfo, VolumeMount, VolumeResize, VolumeSpec
from ...errors import HostUnavailable
from ..host.startup import Host
from ..vm.volumes import VolumeAttach
from ..volumes.clones import VolumeClone
from ..volumes.store import VolumeStore


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
        self._volumes.delete(volume_id)
