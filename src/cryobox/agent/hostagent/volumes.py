"""The interface's volume methods, mixed into :class:`~.agent.HostAgent`: this host's volume images
(:mod:`..volumes.store`)."""

from __future__ import annotations

from collections.abc import Sequence

from ...agentapi.models_volumes import VolumeInfo, VolumeMount, VolumeResize, VolumeSpec
from ...errors import HostUnavailable
from ..host.startup import Host
from ..vm.volumes import VolumeAttach
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
