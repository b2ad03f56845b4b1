"""Volumes: named per workspace, made on one agent, kept when sandboxes go.

A create checks the name and the workspace's ``volumes``/``volume_bytes`` quotas, writes the row first (so two
creates of one name cannot both win), then has the chosen agent make the image; if the agent fails the row goes
too. A volume lives on one host (``host``): the live agent holding the fewest volumes takes a new one. Growing and
deleting are refused with 409 while the volume is attached (a guest's file system must not change under it);
deleting removes the row first, then the image (an agent that cannot be reached keeps a stray image its next
registration reports). Attachments are recorded in the registry (:mod:`cryobox.registry.volumes`): at most one
read-write, any number read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import posixpath
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ...agentapi.models_volumes import MAX_VOLUME_BYTES, MIN_VOLUME_BYTES, VolumeMount, VolumeResize, VolumeSpec
from ...errors import CryoboxError, InvalidArgument, NotFound, StateError
from ...models.volumes import NAME_PATTERN
from ...registry import Registry
from ...registry.volumes import VolumeRecords, VolumeRow
from .fleet import Fleet
from .ownership import StoreOwnership
from .quotas import QuotaGuard
from .volumemoves import Restored, VolumeMover

log = logging.getLogger(__name__)
NAME = re.compile(NAME_PATTERN)
LABEL_PREFIX = "fcvol-"
"""PandaStack labels a volume's file system ``fcvol-<name>``; ext4 keeps 16 bytes of a label."""


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise InvalidArgument(
            f"volume name {name[:80]!r} must be 1-64 of A-Z a-z 0-9 . _ -", details={"field": "name", "name": name[:80]}
        )
    return name


def check_size(size_bytes: int) -> int:
    if not MIN_VOLUME_BYTES <= size_bytes <= MAX_VOLUME_BYTES:
        raise InvalidArgument(
            f"a volume's size must be {MIN_VOLUME_BYTES >> 20} MiB to {MAX_VOLUME_BYTES >> 30} GiB, not {size_bytes}",
            details={"field": "size", "size_bytes": size_bytes},
        )
    return size_bytes


@dataclass(frozen=True)
class MountRequest:
    """A create's ask: volume ``name`` of the workspace at ``path`` in the guest."""

    name: str
    path: str
    read_only: bool = False


MAX_MOUNTS = 4
"""Volumes one sandbox may have (the slots its template was baked with)."""
RESERVED_TOP = frozenset({"proc", "sys", "dev", "run", "bin", "sbin", "lib", "lib64", "usr", "etc", "boot"})
"""Top-level guest directories a volume may not cover."""


def check_mounts(mounts: Sequence[MountRequest]) -> None:
    """400 for more than :data:`MAX_MOUNTS`, a path that is not a normalized absolute path below ``/`` (or one
    of the guest's own trees), the same path or volume twice."""
    if len(mounts) > MAX_MOUNTS:
        raise InvalidArgument(f"at most {MAX_MOUNTS} volumes per sandbox", details={"field": "volumes"})
    paths, names = set(), set()
    for mount in mounts:
        check_name(mount.name)
        path = mount.path
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/" or "\0" in path:
            raise InvalidArgument(
                f"mount path {path[:200]!r} must be a normalized absolute path", details={"path": path[:200]}
            )
        if path.split("/")[1] in RESERVED_TOP:
            raise InvalidArgument(
                f"mount path {path!r} is inside the guest's own {path.split('/')[1]!r}", details={"path": path}
            )
        if path in paths or mount.name in names:
            raise InvalidArgument(f"volume {mount.name!r} or path {path!r} given twice", details={"field": "volumes"})
        paths.add(path)
        names.add(mount.name)


@dataclass(frozen=True)
class VolumeState:
    """A volume's row with what its agent says of its image now (``None``: the agent did not answer)."""

    row: VolumeRow
    used_bytes: int | None
    lost: bool = False
    """Its host is down or lost (:mod:`.volumemoves`)."""

    @property
    def status(self) -> str:
        return "lost" if self.lost else self.row.status


class VolumeControl:
    def __init__(self, registry: Registry, fleet: Fleet, quotas: QuotaGuard, clock: Callable[[], float]) -> None:
        self.records = VolumeRecords(registry.database)
        self.fleet = fleet
        self.quotas = quotas
        self.clock = clock
        self.evict: Callable[[str], Awaitable[bool]] | None = None
        """Let go of a volume the content API's system sandbox holds (:mod:`.volumecontent`): a create wins."""
        self.owners: StoreOwnership | None = None
        """This registry's claims in the object store (set by the control plane): a stored volume is claimed."""
        self.mover = VolumeMover(self.records, fleet, clock, lambda: self.owners)

    async def _host(self) -> str:
        """Where a new volume goes: the up (not draining) agent holding the fewest volumes."""
        return await self.mover.target_for([])

    async def create(self, workspace_id: str, name: str, size_bytes: int) -> VolumeState:
        check_name(name)
        check_size(size_bytes)
        with contextlib.suppress(NotFound):  # a taken name is a 409 before any quota is counted
            await asyncio.to_thread(self.records.get, workspace_id, name)
            raise self.exists(name)
        with await self.quotas.admit_volume(workspace_id, name, size_bytes):
            host = await self._host()
            row = VolumeRow(
                id=f"vol-{secrets.token_hex(6)}",
                workspace_id=workspace_id,
                name=name,
                size_bytes=size_bytes,
                host=host,
                created_at=self.clock(),
            )
            try:
                row = await asyncio.to_thread(self.records.add, row)
            except InvalidArgument as err:  # AlreadyExists: the workspace has one of that name
                raise self.exists(name) from err
            try:
                spec = VolumeSpec(volume_id=row.id, size_bytes=size_bytes, label=(LABEL_PREFIX + name)[:16])
                info = await (await self.fleet.agent(host)).create_volume(spec)
            except BaseException:
                with contextlib.suppress(CryoboxError):
                    await asyncio.to_thread(self.records.delete, row.id)
                raise
        log.info("volume %s (%s, %d bytes) made on %s", name, row.id, size_bytes, host)
        return VolumeState(row, info.used_bytes)

    @staticmethod
    def exists(name: str) -> StateError:
        return StateError(f"volume {name!r} already exists", state="exists", required="absent", details={"name": name})

    async def _state(self, row: VolumeRow) -> VolumeState:
        if await self.mover.host_state(row.host) == "down":
            return VolumeState(row, None, lost=True)
        try:
            info = await (await self.fleet.agent(row.host)).volume_info(row.id)
        except CryoboxError:
            return VolumeState(row, None)
        return VolumeState(row, info.used_bytes)

    async def row_by_id(self, workspace_id: str, volume_id: str) -> VolumeRow:
        """The workspace's volume ``volume_id`` (404 otherwise, also across workspaces)."""
        try:
            row = await asyncio.to_thread(self.records.by_id, volume_id)
        except NotFound:
            row = None
        if row is None or row.workspace_id != workspace_id:
            raise NotFound(f"volume {volume_id[:80]} not found", details={"volume_id": volume_id[:80]})
        return row

    async def get(self, workspace_id: str, name: str) -> VolumeState:
        return await self._state(await asyncio.to_thread(self.records.get, workspace_id, name))

    async def list_states(self, workspace_id: str) -> list[VolumeState]:
        rows = await asyncio.to_thread(self.records.list_volumes, workspace_id)
        return list(await asyncio.gather(*(self._state(row) for row in rows)))

    async def resize(self, workspace_id: str, name: str, size_bytes: int) -> VolumeState:
        """Grow the volume (the same size: nothing); 400 to shrink, 409 while attached."""
        check_size(size_bytes)
        row = await asyncio.to_thread(self.records.get, workspace_id, name)
        if size_bytes < row.size_bytes:
            raise InvalidArgument(
                f"a volume only grows: {size_bytes} bytes is less than its {row.size_bytes}",
                details={"size_bytes": size_bytes, "current_bytes": row.size_bytes},
            )
        if row.attachments and await self._let_go(row):
            row = await asyncio.to_thread(self.records.get, workspace_id, name)
        if row.attachments:
            raise StateError(
                f"volume {name!r} is attached: resize it while no sandbox has it",
                state="attached",
                required="detached",
                details={"attached_to": [a.sandbox_id for a in row.attachments]},
            )
        if size_bytes == row.size_bytes:
            return await self._state(row)
        with await self.quotas.admit_volume(workspace_id, None, size_bytes - row.size_bytes):
            info = await (await self.fleet.agent(row.host)).resize_volume(row.id, VolumeResize(size_bytes=size_bytes))
            row = await asyncio.to_thread(self.records.resize, row.id, info.size_bytes)
        return VolumeState(row, info.used_bytes)

    async def delete(self, workspace_id: str, name: str) -> None:
        """Delete a volume no sandbox has attached (409 otherwise; 404 when there is none)."""
        row = await asyncio.to_thread(self.records.get, workspace_id, name)
        if row.attachments:
            await self._let_go(row)
        await asyncio.to_thread(self.records.delete, row.id)  # 409 while attached
        try:
            await (await self.fleet.agent(row.host)).delete_volume(row.id)
        except CryoboxError as err:
            log.warning("volume %s deleted while its agent %s could not remove the image: %s", row.id, row.host, err)

    async def claim(
        self, workspace_id: str, sandbox_id: str, mounts: Sequence[MountRequest]
    ) -> tuple[list[VolumeMount], str | None]:
        """Attach ``mounts`` to new sandbox ``sandbox_id`` (its one read-write holder, or a reader of each) and say
        the host they are all on (the sandbox must be placed there; ``None`` without mounts). 404 for an unknown
        volume, 409 for one attached read-write elsewhere or volumes on different hosts; nothing is kept then."""
        check_mounts(mounts)
        if not mounts:
            return [], None
        in_place = await self._claim_in_place(workspace_id, sandbox_id, mounts)
        if in_place is not None:
            return in_place
        rows = [await asyncio.to_thread(self.records.get, workspace_id, m.name) for m in mounts]
        rows = await self._gather(rows)
        hosts = sorted({row.host for row in rows})
        attached: list[VolumeMount] = []
        try:
            for row, mount in zip(rows, mounts, strict=True):
                await self._attach(row, sandbox_id, mount)
                attached.append(VolumeMount(volume_id=row.id, path=mount.path, read_only=mount.read_only))
        except BaseException:
            await self.sandbox_gone(sandbox_id)
            raise
        return attached, hosts[0]

    async def _claim_in_place(
        self, workspace_id: str, sandbox_id: str, mounts: Sequence[MountRequest]
    ) -> tuple[list[VolumeMount], str] | None:
        """The common case, one volume where it is on a live host, in one registry transaction; ``None`` when that
        is not so (more volumes, its host not up, the volume held or moving): nothing is kept then, and the caller
        takes the long way (moves, the content API's eviction)."""
        if len(mounts) != 1:
            return None
        mount = mounts[0]
        attach = functools.partial(self.records.attach_named, workspace_id, mount.name, sandbox_id, mount.path)
        try:
            row = await asyncio.to_thread(attach, read_only=mount.read_only, alive_after=self.fleet.alive_after())
        except StateError:
            return None
        if row is None:
            return None
        return [VolumeMount(volume_id=row.id, path=mount.path, read_only=mount.read_only)], row.host

    async def _gather(self, rows: list[VolumeRow]) -> list[VolumeRow]:
        """``rows`` on one host that takes sandboxes: as they are when they are, else those elsewhere moved to one
        (:mod:`.volumemoves`; 409 ``lost`` when a host holding one is down, 409 when one is attached there)."""
        states = {host: await self.mover.host_state(host) for host in {row.host for row in rows}}
        lost = [row for row in rows if states[row.host] == "down"]
        if lost:
            raise StateError(
                f"volume {lost[0].name!r} is lost: its host {lost[0].host} is down; it is back when the host is, or "
                f"when an operator restores it from its last stored copy (POST /v1/volumes/{lost[0].name}/restore)",
                state="lost",
                required="ready",
                details={"volume": lost[0].name, "host": lost[0].host, "stored_at": lost[0].stored_at},
            )
        if len(states) == 1 and next(iter(states.values())) == "up":
            return rows
        target = await self.mover.target_for(rows)
        out = []
        for row in rows:
            if row.host != target:
                if row.attachments and await self._let_go(row):
                    row = await asyncio.to_thread(self.records.by_id, row.id)
                row = await self.mover.move(row, target)
            out.append(row)
        return out

    async def restore(self, workspace_id: str, name: str) -> Restored:
        """Bring a lost volume back from its last stored copy (see :mod:`.volumemoves`)."""
        return await self.mover.restore(await asyncio.to_thread(self.records.get, workspace_id, name))

    async def _let_go(self, row: VolumeRow) -> bool:
        """Whether the content API's system sandbox held the volume (it is gone now)."""
        return self.evict is not None and await self.evict(row.id)

    async def _attach(self, row: VolumeRow, sandbox_id: str, mount: MountRequest) -> None:
        """Record the attachment; one refused while the content API's system sandbox holds the volume is tried
        again once that sandbox is gone."""
        attach = functools.partial(self.records.attach, row.id, sandbox_id, mount.path, read_only=mount.read_only)
        try:
            await asyncio.to_thread(attach)
        except StateError:
            if not await self._let_go(row):
                raise
            await asyncio.to_thread(attach)

    async def mounts_of(self, sandbox_id: str) -> list[tuple[str, str, bool]]:
        """(volume name, path, read-only) of each of the sandbox's mounts."""
        mounts = await asyncio.to_thread(self.records.mounts_of, sandbox_id)
        return [(name, a.path, a.read_only) for a, name in mounts]

    async def sandbox_gone(self, sandbox_id: str) -> None:
        """A deleted sandbox's attachments go (its volumes and their data stay)."""
        with contextlib.suppress(NotFound):
            await asyncio.to_thread(self.records.detach_sandbox, sandbox_id)
