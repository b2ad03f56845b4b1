"""The volume methods of :class:`~.fake_agent.FakeAgent`: images in memory (sizes only, nothing formatted); a fork
child's clones are made as the real agent makes them (404 for a source not here, 409 for an id held) and go again
when the child fails."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from cryobox.agentapi.models import SandboxInfo
from cryobox.agentapi.models_volumes import ChildVolume, StoredVolume, VolumeFetch, VolumeInfo, VolumeResize, VolumeSpec
from cryobox.errors import IntegrityError, InvalidArgument, NotFound, ObjectNotFound, StateError
from cryobox.objstore.client import ObjectStore


class FakeVolumes:
    """Mixed into ``FakeAgent`` (whose ``_record`` it uses); ``volumes``: id -> size in bytes."""

    volumes: dict[str, int]
    objects: ObjectStore
    attached_here: set[str]
    """Volumes a sandbox of this fake has attached (store, fetch and delete refuse them: 409)."""
    held: dict[str, list[str]]
    """Sandbox id -> the volumes it was created (or woke) with."""
    sandboxes: dict[str, SandboxInfo]

    def _record(self, method: str, *args: object) -> None:
        raise NotImplementedError

    def _clone_volumes(self, volumes: Sequence[ChildVolume]) -> list[str]:
        """Make a fork child's clones (all or nothing); their ids."""
        wanted = [v for v in volumes if v.clone_of is not None]
        for v in wanted:
            self._volume(v.clone_of or "")
            if v.volume_id in self.volumes:
                raise StateError(f"volume {v.volume_id} exists on this host already", state="exists")
        for v in wanted:
            self.volumes[v.volume_id] = self.volumes[v.clone_of or ""]
        return [v.volume_id for v in wanted]

    def _drop_clones(self, volume_ids: Sequence[str]) -> None:
        for volume_id in volume_ids:
            self.volumes.pop(volume_id, None)

    def _volume(self, volume_id: str) -> VolumeInfo:
        if volume_id not in self.volumes:
            raise NotFound(f"volume {volume_id} is not on this host", details={"volume_id": volume_id})
        size = self.volumes[volume_id]
        return VolumeInfo(volume_id=volume_id, size_bytes=size, allocated_bytes=size, used_bytes=min(size, 4 << 20))

    async def list_volumes(self) -> list[VolumeInfo]:
        self._record("list_volumes")
        return [self._volume(v) for v in sorted(self.volumes)]

    async def create_volume(self, spec: VolumeSpec) -> VolumeInfo:
        self._record("create_volume", spec)
        self.volumes.setdefault(spec.volume_id, spec.size_bytes)
        return self._volume(spec.volume_id)

    async def volume_info(self, volume_id: str) -> VolumeInfo:
        self._record("volume_info", volume_id)
        return self._volume(volume_id)

    async def resize_volume(self, volume_id: str, request: VolumeResize) -> VolumeInfo:
        self._record("resize_volume", volume_id, request)
        current = self._volume(volume_id)
        if request.size_bytes < current.size_bytes:
            raise InvalidArgument("a volume only grows", details={"size_bytes": request.size_bytes})
        self.volumes[volume_id] = request.size_bytes
        return self._volume(volume_id)

    async def delete_volume(self, volume_id: str) -> None:
        self._record("delete_volume", volume_id)
        self._not_attached(volume_id)
        self.volumes.pop(volume_id, None)

    def _not_attached(self, volume_id: str, *, hibernated_ok: bool = False) -> None:
        """409 while a sandbox here has it attached (``hibernated_ok``: unless every such sandbox is hibernated,
        its VM gone, as the real agent stores a drained sandbox's volume)."""
        states = {self.sandboxes[sid].state for sid, ids in self.held.items() if volume_id in ids}
        writing = bool(states) and not (hibernated_ok and states == {"hibernated"})
        if volume_id in self.attached_here or writing:
            raise StateError(f"volume {volume_id} is attached here", state="attached", required="detached")

    async def store_volume(self, volume_id: str) -> StoredVolume:
        """ "Uploads" the image: ``volumes/<id>/manifest.json`` in ``objects`` names its size (and a store count)."""
        self._record("store_volume", volume_id)
        size = self._volume(volume_id).size_bytes
        self._not_attached(volume_id, hibernated_ok=True)
        key = f"volumes/{volume_id}/manifest.json"
        count = len(self.objects.list(f"volumes/{volume_id}/stores")) + 1
        self.objects.put(f"volumes/{volume_id}/stores/{count}", b"")
        data = json.dumps({"volume_id": volume_id, "size_bytes": size, "store": count}).encode()
        self.objects.put(key, data)
        return StoredVolume(
            volume_id=volume_id,
            key=f"volumes/{volume_id}",
            manifest_sha256=hashlib.sha256(data).hexdigest(),
            size_bytes=size,
            stored_bytes=size,
            uploaded_bytes=size,
        )

    async def fetch_volume(self, request: VolumeFetch) -> VolumeInfo:
        self._record("fetch_volume", request)
        self._not_attached(request.volume_id)
        try:
            data = self.objects.get(f"volumes/{request.volume_id}/manifest.json")
        except ObjectNotFound:
            raise NotFound(f"volume {request.volume_id} has no stored image") from None
        if hashlib.sha256(data).hexdigest() != request.manifest_sha256:
            raise IntegrityError("the stored volume manifest is not the pinned one")
        self.volumes[request.volume_id] = int(json.loads(data)["size_bytes"])
        return self._volume(request.volume_id)
