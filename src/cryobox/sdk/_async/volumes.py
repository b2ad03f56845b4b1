"""``AsyncVolumes``: the workspace's volumes — data that outlives sandboxes::

from cryobox.sdk import AsyncVolumes

async with AsyncVolumes() as volumes:
    vol = await volumes.create("dataset", size_mb=2048)
    print(vol.id, vol.size_bytes, vol.attached_to)
"""

from __future__ import annotations

import builtins

from ... import models
from .. import _volumes
from ._resource import AsyncApiClient


class AsyncVolumes(AsyncApiClient):
    """The workspace's volumes. ``http`` is an optional client to use (custom transport, tests); this object
    takes ownership of it."""

    async def create(self, name: str, *, size_mb: int = 1024) -> models.Volume:
        """Make volume ``name`` (an ext4 file system of ``size_mb`` MiB).

        :raises InvalidArgument: a bad name or size (nothing is sent). :raises StateError: the name is taken.
        :raises WorkspaceQuotaExceeded: past the workspace's volume quotas."""
        return _volumes.parse_volume(await self._send(_volumes.create_request(name, size_mb)))

    async def list(self) -> builtins.list[models.Volume]:
        return _volumes.parse_list(await self._send(_volumes.list_request()))

    async def get(self, name: str) -> models.Volume:
        """:raises NotFound: no such volume in the workspace."""
        return _volumes.parse_volume(await self._send(_volumes.get_request(name)))

    async def resize(self, name: str, *, size_mb: int) -> models.Volume:
        """Grow the volume (its file system grows when a sandbox next mounts it).

        :raises InvalidArgument: smaller than it is. :raises StateError: it is attached."""
        return _volumes.parse_volume(await self._send(_volumes.resize_request(name, size_mb)))

    async def delete(self, name: str) -> None:
        """:raises StateError: a sandbox has it attached. :raises NotFound: no such volume."""
        await self._send(_volumes.delete_request(name))
