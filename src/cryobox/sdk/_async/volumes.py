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

    async def restore(self, name: str) -> models.VolumeRestored:
        """Bring a volume whose host is lost back from its last copy in the object store, on a live host; writes
        made after that copy (``restored_from``) are lost.

        :raises StateError: its host is up, or it was never stored."""
        return _volumes.parse_restored(await self._send(_volumes.restore_request(name)))

    # -- its files, without a sandbox of yours (read and written in a system sandbox with the volume mounted) --

    async def read_file(self, name: str, path: str) -> bytes:
        """The bytes of ``path`` (absolute in the volume).

        :raises NotFound: no such file. :raises StateError: a sandbox has the volume mounted read-write."""
        return (await self._send(_volumes.read_file_request(name, path))).content

    async def write_file(
        self, name: str, path: str, data: bytes | str, *, overwrite: bool = True
    ) -> models.VolumeEntry:
        """Write ``path`` (its directory must exist); ``overwrite=False`` refuses an existing file.

        :raises StateError: the file exists (without ``overwrite``), or a sandbox has the volume mounted."""
        return _volumes.parse_entry(await self._send(_volumes.write_file_request(name, path, data, overwrite)))

    async def list_files(self, name: str, path: str = "/", *, depth: int = 1) -> builtins.list[models.VolumeEntry]:
        """The entries under directory ``path``, ``depth`` levels down (symlinks are listed, never followed)."""
        return _volumes.parse_entries(await self._send(_volumes.list_files_request(name, path, depth)))

    async def stat(self, name: str, path: str) -> models.VolumeEntry:
        """:raises NotFound: nothing at ``path``."""
        return _volumes.parse_entry(await self._send(_volumes.stat_request(name, path)))

    async def make_dir(self, name: str, path: str, *, parents: bool = False) -> models.VolumeEntry:
        """:raises StateError: something is there already (with ``parents``, a directory there is fine)."""
        return _volumes.parse_entry(await self._send(_volumes.make_dir_request(name, path, parents)))

    async def remove(self, name: str, path: str) -> None:
        """Remove a file, or a directory with everything in it. :raises NotFound: nothing at ``path``."""
        await self._send(_volumes.remove_request(name, path))
