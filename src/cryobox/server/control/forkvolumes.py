"""The volumes of fork children: each child of ``fork`` or ``fork_tree`` gets a copy-on-write clone of each of its
parent's read-write volumes, as a new volume of the workspace named after the child (``<volume>-<child id>``), and
every read-only volume of the parent attached read-only, at the parent's paths.

Order, so that a refusal makes nothing and a failed child keeps nothing:

1. the parent's mounts are read from the registry (:meth:`ForkVolumes.parent_mounts`);
2. the clones of every child are counted against the workspace's ``volumes`` and ``volume_bytes`` quotas at once
   (:meth:`ForkVolumes.admit`: 429 ``quota_exceeded`` before anything is captured, reserved or written);
3. for each placed child, before the agent is asked, its clones' rows are written (on the parent's host, where
   the agent makes their images), each attached read-write to the child, and the read-only volumes attached to
   it read-only (:meth:`ForkVolumes.attach_child`): what the agent gets as the child's ``ChildVolume`` list;
4. a child that failed (or whose row could not be written) is detached and its clones deleted, rows then
   images (:meth:`ForkVolumes.child_gone`). A child deleted later keeps its clone: data outlives sandboxes.

The children must be on the parent's agent (the images are files there): :mod:`.forks` places them nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from ...agentapi.models_volumes import ChildVolume
from ...errors import CryoboxError, InvalidArgument, NotFound
from ...registry.volumes import VolumeRow
from .quotas import Admission
from .volumes import VolumeControl

log = logging.getLogger(__name__)
MAX_NAME = 64


@dataclass(frozen=True)
class ParentMount:
    """One of the parent's mounts: the volume's row, where it is mounted and how."""

    row: VolumeRow
    path: str
    read_only: bool


def clone_name(volume: str, child_id: str) -> str:
    """``<volume>-<child id>``, the volume's name cut short where the whole would pass 64 characters."""
    keep = MAX_NAME - len(child_id) - 1
    if keep < 1:
        raise InvalidArgument(f"child id {child_id[:80]!r} is too long to name a volume after it")
    return f"{volume[:keep]}-{child_id}"


class ForkVolumes:
    def __init__(self, volumes: VolumeControl) -> None:
        self.volumes = volumes

    async def parent_mounts(self, parent_id: str) -> list[ParentMount]:
        """The parent's mounts, read-write ones first (each kind in the order they were attached)."""
        mounts = await asyncio.to_thread(self.volumes.records.mounts_of, parent_id)
        out = []
        for attachment, _ in mounts:
            row = await asyncio.to_thread(self.volumes.records.by_id, attachment.volume_id)
            out.append(ParentMount(row, attachment.path, attachment.read_only))
        return sorted(out, key=lambda m: m.read_only)

    async def admit(self, workspace_id: str, mounts: Sequence[ParentMount], child_ids: Sequence[str]) -> Admission:
        """The clones of every child within the workspace's volume quotas (429 with nothing counted). Release once
        their rows are written (or the fork failed)."""
        sources = [m.row for m in mounts if not m.read_only]
        names = [clone_name(row.name, child) for child in child_ids for row in sources]
        added = sum(row.size_bytes for row in sources) * len(child_ids)
        return await self.volumes.quotas.admit_volumes(workspace_id, names, added)

    async def attach_child(self, workspace_id: str, child_id: str, mounts: Sequence[ParentMount]) -> list[ChildVolume]:
        """Write the rows of ``child_id``'s clones and its attachments (the clones read-write, the parent's
        read-only volumes read-only); what the agent gets for it. On a failure nothing of it stays (409 for a
        clone name the workspace has taken, or a read-only volume that got a writer)."""
        records = self.volumes.records
        made: list[ChildVolume] = []
        try:
            for mount in mounts:
                if mount.read_only:
                    await asyncio.to_thread(
                        functools.partial(records.attach, mount.row.id, child_id, mount.path, read_only=True)
                    )
                    made.append(ChildVolume(volume_id=mount.row.id, path=mount.path, read_only=True))
                    continue
                row = VolumeRow(
                    id=f"vol-{secrets.token_hex(6)}",
                    workspace_id=workspace_id,
                    name=clone_name(mount.row.name, child_id),
                    size_bytes=mount.row.size_bytes,
                    host=mount.row.host,
                    created_at=self.volumes.clock(),
                    filesystem=mount.row.filesystem,
                )
                try:
                    row = await asyncio.to_thread(records.add, row)
                except InvalidArgument as err:  # AlreadyExists: the workspace has a volume of that name
                    raise self.volumes.exists(row.name) from err
                made.append(ChildVolume(volume_id=row.id, path=mount.path, clone_of=mount.row.id))
                await asyncio.to_thread(
                    functools.partial(records.attach, row.id, child_id, mount.path, read_only=False)
                )
        except BaseException:
            await self.child_gone(child_id, made)
            raise
        return made

    async def child_gone(self, child_id: str, volumes: Sequence[ChildVolume]) -> None:
        """A child that failed: its attachments go, and its clones with their images (best effort, logged)."""
        await self.volumes.sandbox_gone(child_id)
        for volume in volumes:
            if volume.clone_of is None:
                continue
            try:
                row = await asyncio.to_thread(self.volumes.records.by_id, volume.volume_id)
            except NotFound:
                continue
            with contextlib.suppress(NotFound):
                await asyncio.to_thread(self.volumes.records.delete, row.id)
            try:
                await (await self.volumes.fleet.agent(row.host)).delete_volume(row.id)
            except CryoboxError as err:
                log.warning("clone %s of failed child %s: its image stays on %s: %s", row.id, child_id, row.host, err)
