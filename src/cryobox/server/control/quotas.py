"""Per-workspace quotas: one guard every way a sandbox, a snapshot or a custom template comes to exist asks first.

**Limits** (:class:`Quota`): server defaults from the environment (``CRYOBOX_QUOTA_SANDBOXES`` 50,
``CRYOBOX_QUOTA_VCPUS`` 64, ``CRYOBOX_QUOTA_MEMORY_MIB`` 32768, ``CRYOBOX_QUOTA_SNAPSHOT_BYTES`` 50 GiB,
``CRYOBOX_QUOTA_TEMPLATES`` 20, ``CRYOBOX_DEFAULT_TTL_S`` none, ``CRYOBOX_MAX_TTL_S`` 30 days), each overridable per
workspace in the registry (``cryobox keys quota``; :class:`~cryobox.registry.QuotaRecords`).

**Usage** (:meth:`QuotaGuard.usage`) comes from the workspace's registry rows plus the admissions in flight on this
replica: sandboxes ``starting|running|paused`` count as sandboxes, with their vCPUs and memory; ``hibernated`` ones
count against ``hibernated`` (``CRYOBOX_QUOTA_HIBERNATED`` 100) instead — they hold no host memory or CPU, only
disk, which the paused retention bounds in time (:mod:`.timeouts`); a wake makes one a sandbox again, so it needs
room among the sandboxes, vCPUs and memory. ``lost``, ``stopped`` and ``error`` rows count for nothing. Snapshot
bytes: the ``size_bytes`` of every snapshot row of the workspace. Templates: its custom templates, whatever their
status.

**Admission** (:meth:`QuotaGuard.admit`): under a per-workspace lock, usage is read and the request added to it;
past any limit :class:`~cryobox.errors.WorkspaceQuotaExceeded` (429 ``quota_exceeded``, details ``{resource,
limit, used, requested}``) is raised before anything is reserved on an agent. Otherwise the request stays counted
(an :class:`Admission`) until the caller releases it, when its create, fork, tree or wake has finished or failed:
two concurrent creates cannot both take the last slot. A claim names its sandbox ids, so once a row of it is
written it is not counted twice. The lock is per process: two control-plane replicas admitting into the same
workspace at the same instant may overshoot by what they admit at once.

**TTL** (:meth:`QuotaGuard.ttl`): a create without ``ttl_seconds`` (and not ``persistent``) gets the default TTL
(none by default: such sandboxes never expire, as before); a ``ttl_seconds`` above the maximum is refused with 400.
``persistent`` stays allowed (bound such sandboxes with the sandbox quota).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import NoReturn

from ...errors import InvalidArgument, WorkspaceQuotaExceeded
from ...registry import HIBERNATED, QuotaOverrides, QuotaRecords, WorkspaceUse
from ...registry.quotas import HOLDING_STATUSES

ENV = {
    "sandboxes": "CRYOBOX_QUOTA_SANDBOXES",
    "vcpus": "CRYOBOX_QUOTA_VCPUS",
    "memory_mib": "CRYOBOX_QUOTA_MEMORY_MIB",
    "snapshot_bytes": "CRYOBOX_QUOTA_SNAPSHOT_BYTES",
    "templates": "CRYOBOX_QUOTA_TEMPLATES",
    "default_ttl_s": "CRYOBOX_DEFAULT_TTL_S",
    "max_ttl_s": "CRYOBOX_MAX_TTL_S",
    "hibernated": "CRYOBOX_QUOTA_HIBERNATED",
    "volumes": "CRYOBOX_QUOTA_VOLUMES",
    "volume_bytes": "CRYOBOX_QUOTA_VOLUME_BYTES",
}
MAX_TTL_S = 30 * 24 * 3600  # the API's own upper bound for ttl_seconds


@dataclass(frozen=True)
class Quota:
    """A workspace's effective limits (the defaults suit one 24 GiB host shared by a few workspaces)."""

    sandboxes: int = 50
    vcpus: int = 64
    memory_mib: int = 32768
    snapshot_bytes: int = 50 << 30
    templates: int = 20
    default_ttl_s: int | None = None
    """Given to creates that ask for no TTL; ``None``: they never expire (the behaviour before quotas)."""
    max_ttl_s: int = MAX_TTL_S
    hibernated: int = 100
    """Hibernated (paused) sandboxes it may keep: a hibernation past it, explicit or at a TTL, is refused."""
    volumes: int = 20
    volume_bytes: int = 100 << 30
    """The sizes of its volumes, summed (a create or a resize past it is refused)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Quota:
        """Defaults from ``CRYOBOX_QUOTA_*``, ``CRYOBOX_DEFAULT_TTL_S`` (0 or empty: none), ``CRYOBOX_MAX_TTL_S``."""
        environ = os.environ if env is None else env
        values: dict[str, int | None] = {}
        for name, var in ENV.items():
            raw = environ.get(var, "").strip()
            if not raw:
                continue
            try:
                value = int(raw)
            except ValueError:
                raise InvalidArgument(f"{var} must be a non-negative integer, not {raw!r}") from None
            if value < 0 or (name == "max_ttl_s" and value < 1):
                raise InvalidArgument(f"{var} must be {'positive' if name == 'max_ttl_s' else 'non-negative'}: {raw}")
            values[name] = value if name != "default_ttl_s" or value > 0 else None
        return cls(**values)  # type: ignore[arg-type]

    def with_overrides(self, overrides: QuotaOverrides) -> Quota:
        """These limits with a workspace's own in place of the defaults (``default_ttl_s`` 0: none)."""
        changes: dict[str, int | None] = {k: v for k, v in overrides.values().items() if v is not None}
        if "default_ttl_s" in changes and not changes["default_ttl_s"]:
            changes["default_ttl_s"] = None
        return replace(self, **changes)  # type: ignore[arg-type]

    def limits(self) -> dict[str, int | None]:
        return asdict(self)


@dataclass(frozen=True)
class Usage:
    sandboxes: int = 0
    vcpus: int = 0
    memory_mib: int = 0
    snapshot_bytes: int = 0
    templates: int = 0
    hibernated: int = 0
    volumes: int = 0
    volume_bytes: int = 0


@dataclass(frozen=True, eq=False)
class _Claim:
    """Sandboxes (or template names) admitted and not yet released; sizes are per sandbox."""

    sandbox_ids: tuple[str, ...] = ()
    """Sandboxes becoming live (created, forked or woken): counted until their rows say so."""
    vcpus: int = 0
    memory_mib: int = 0
    templates: tuple[str, ...] = ()
    hibernating: tuple[str, ...] = ()
    """Sandboxes being hibernated: counted as hibernated until their rows say so."""
    volume_names: tuple[str, ...] = ()
    """Volumes being created: counted until their rows exist."""
    volume_bytes: int = 0
    """Bytes a volume create or resize adds, until its row says so."""


def usage_of(use: WorkspaceUse, claims: Sequence[_Claim] = ()) -> Usage:
    """What the rows of ``use`` hold, plus ``claims`` (admissions in flight) not written as rows yet."""
    holding = {s.id for s in use.sandboxes if s.status in HOLDING_STATUSES}
    hibernated = {s.id for s in use.sandboxes if s.status == HIBERNATED}
    vcpus = sum(s.cpus for s in use.sandboxes if s.id in holding)
    memory = sum(s.memory_mib for s in use.sandboxes if s.id in holding)
    sandboxes, templates = len(holding), set(use.templates)
    for claim in claims:
        for sandbox_id in claim.sandbox_ids:
            if sandbox_id in holding:  # its row is written: counted above
                continue
            sandboxes += 1
            vcpus += claim.vcpus
            memory += claim.memory_mib
        hibernated |= set(claim.hibernating)
        templates |= set(claim.templates)
    volume_bytes = use.volume_bytes + sum(c.volume_bytes for c in claims)
    volumes = use.volumes + sum(len(c.volume_names) for c in claims)
    return Usage(sandboxes, vcpus, memory, use.snapshot_bytes, len(templates), len(hibernated), volumes, volume_bytes)


class Admission:
    """What :meth:`QuotaGuard.admit` counted for a request until :meth:`release` (or the end of a ``with``)."""

    def __init__(self, guard: QuotaGuard, workspace_id: str, claim: _Claim, quota: Quota) -> None:
        self._guard, self._workspace_id, self._claim = guard, workspace_id, claim
        self.quota = quota

    def release(self) -> None:
        """Stop counting the claim (idempotent): its rows count from now on, or it failed and holds nothing."""
        claims = self._guard._claims.get(self._workspace_id)
        if claims is not None and self._claim in claims:
            claims.remove(self._claim)
            if not claims:
                self._guard._claims.pop(self._workspace_id, None)

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.release()


SEEN_WORKSPACES = 4096
"""Workspaces whose last read limits a control plane remembers (for :meth:`QuotaGuard.ttl`)."""


class QuotaGuard:
    """Per-workspace limits against registry usage plus this process's admissions in flight."""

    def __init__(self, records: QuotaRecords, defaults: Quota | None = None) -> None:
        self.records = records
        self.defaults = defaults if defaults is not None else Quota.from_env()
        self._locks: dict[str, asyncio.Lock] = {}
        self._claims: dict[str, list[_Claim]] = {}
        self._seen: OrderedDict[str, Quota] = OrderedDict()
        """The limits each workspace had at its last read here (:data:`SEEN_WORKSPACES` at most): what a create's
        first TTL check uses; the admission's fresh read decides (:func:`ttl_for`)."""

    def _saw(self, workspace_id: str, quota: Quota) -> Quota:
        self._seen[workspace_id] = quota
        self._seen.move_to_end(workspace_id)
        while len(self._seen) > SEEN_WORKSPACES:
            self._seen.popitem(last=False)
        return quota

    def _lock(self, workspace_id: str) -> asyncio.Lock:
        return self._locks.setdefault(workspace_id, asyncio.Lock())

    async def _read(self, workspace_id: str, *, sandboxes_only: bool = False) -> tuple[Quota, Usage]:
        """The limits and the usage now; ``sandboxes_only``: of what admitting a sandbox checks (sandboxes, vCPUs,
        memory), the rest read as zero (three queries fewer, ~1 ms of a create)."""
        read = self.records.sandbox_use if sandboxes_only else self.records.use
        use = await asyncio.to_thread(read, workspace_id)
        quota = self._saw(workspace_id, self.defaults.with_overrides(use.overrides))
        return quota, usage_of(use, self._claims.get(workspace_id, ()))

    async def limits(self, workspace_id: str) -> Quota:
        overrides = await asyncio.to_thread(self.records.get, workspace_id)
        return self._saw(workspace_id, self.defaults.with_overrides(overrides))

    async def status(self, workspace_id: str) -> tuple[Quota, Usage]:
        """The workspace's effective limits and its usage now (admissions in flight included)."""
        return await self._read(workspace_id)

    async def admit(
        self,
        workspace_id: str,
        vcpus: int,
        memory_mib: int,
        count: int = 1,
        *,
        sandbox_ids: Sequence[str] | None = None,
    ) -> Admission:
        """Count ``count`` sandboxes of ``vcpus`` and ``memory_mib`` each against the workspace's quota, or raise
        :class:`WorkspaceQuotaExceeded` with nothing counted. A wake is admitted the same way (its hibernated row
        becomes a live sandbox again). Release the admission when the work has finished or failed."""
        ids = tuple(sandbox_ids) if sandbox_ids is not None else tuple(f"~{secrets.token_hex(6)}" for _ in range(count))
        if len(ids) != count:
            raise ValueError(f"{count} sandboxes admitted with {len(ids)} ids")
        claim = _Claim(sandbox_ids=ids, vcpus=vcpus, memory_mib=memory_mib)
        async with self._lock(workspace_id):
            quota, used = await self._read(workspace_id, sandboxes_only=True)
            _require("sandboxes", quota.sandboxes, used.sandboxes, count)
            _require("vcpus", quota.vcpus, used.vcpus, vcpus * count)
            _require("memory_mib", quota.memory_mib, used.memory_mib, memory_mib * count)
            self._claims.setdefault(workspace_id, []).append(claim)
        return Admission(self, workspace_id, claim, quota)

    async def admit_hibernation(self, workspace_id: str, sandbox_id: str) -> Admission:
        """A sandbox about to hibernate (explicitly, at its TTL or for a drain): it must fit the ``hibernated``
        quota unless it is hibernated already. Release once its row says ``hibernated`` (or the attempt failed)."""
        claim = _Claim(hibernating=(sandbox_id,))
        async with self._lock(workspace_id):
            use = await asyncio.to_thread(self.records.use, workspace_id)
            quota = self.defaults.with_overrides(use.overrides)
            if not any(s.id == sandbox_id and s.status == HIBERNATED for s in use.sandboxes):
                used = usage_of(use, self._claims.get(workspace_id, ()))
                _require("hibernated", quota.hibernated, used.hibernated, 1)
            self._claims.setdefault(workspace_id, []).append(claim)
        return Admission(self, workspace_id, claim, quota)

    async def admit_volume(self, workspace_id: str, name: str | None, added_bytes: int) -> Admission:
        """A new volume ``name`` of ``added_bytes`` (``name`` None: a resize adding them) within the ``volumes``
        and ``volume_bytes`` quotas. Release once its row says so (or the attempt failed)."""
        return await self.admit_volumes(workspace_id, [name] if name is not None else [], added_bytes)

    async def admit_volumes(self, workspace_id: str, names: Sequence[str], added_bytes: int) -> Admission:
        """New volumes ``names`` (none: a resize) adding ``added_bytes`` in all (fork children's clones), within
        the ``volumes`` and ``volume_bytes`` quotas; asking for nothing is never refused. Release once their rows
        say so (or the attempt failed)."""
        claim = _Claim(volume_names=tuple(names), volume_bytes=added_bytes)
        async with self._lock(workspace_id):
            quota, used = await self._read(workspace_id)
            if names:
                _require("volumes", quota.volumes, used.volumes, len(names))
            if added_bytes or names:
                _require("volume_bytes", quota.volume_bytes, used.volume_bytes, added_bytes)
            self._claims.setdefault(workspace_id, []).append(claim)
        return Admission(self, workspace_id, claim, quota)

    async def admit_template(self, workspace_id: str, name: str) -> Admission:
        """A build of custom template ``name``: a new name must fit the ``templates`` quota (a rebuild of one
        the workspace has already does not add one). Release once its row is written."""
        claim = _Claim(templates=(name,))
        async with self._lock(workspace_id):
            use = await asyncio.to_thread(self.records.use, workspace_id)
            quota = self.defaults.with_overrides(use.overrides)
            if name not in use.templates:
                used = usage_of(use, self._claims.get(workspace_id, ()))
                _require("templates", quota.templates, used.templates, 1)
            self._claims.setdefault(workspace_id, []).append(claim)
        return Admission(self, workspace_id, claim, quota)

    async def admit_snapshot(self, workspace_id: str, size_bytes: int = 0) -> None:
        """A new snapshot: refused while the workspace's snapshots hold its ``snapshot_bytes`` or more, or when
        one of known size (an import) would take it past that. A capture's size is known only afterwards."""
        quota, used = await self._read(workspace_id)
        if used.snapshot_bytes >= quota.snapshot_bytes:
            _refuse("snapshot_bytes", quota.snapshot_bytes, used.snapshot_bytes, size_bytes)
        _require("snapshot_bytes", quota.snapshot_bytes, used.snapshot_bytes, size_bytes)

    async def ttl(self, workspace_id: str, ttl_s: int | None, persistent: bool) -> int | None:
        """The TTL a create gets (:func:`ttl_for`) by the limits last read here for the workspace (read now if
        none were): a create's first check, so that a TTL above the maximum is refused before anything else. The
        create's admission reads the limits again, and they decide: ``ttl_for(admission.quota, ...)``."""
        seen = self._seen.get(workspace_id)
        if seen is not None:
            with contextlib.suppress(InvalidArgument):  # refused: the maximum may have been raised since
                return ttl_for(seen, ttl_s, persistent)
        return ttl_for(await self.limits(workspace_id), ttl_s, persistent)


def ttl_for(quota: Quota, ttl_s: int | None, persistent: bool) -> int | None:
    """The TTL a create gets under ``quota``: the default when none is asked for (and not persistent); 400 above
    the max."""
    check_ttl(quota, ttl_s)
    if ttl_s is None and not persistent and quota.default_ttl_s is not None:
        return min(quota.default_ttl_s, quota.max_ttl_s)
    return ttl_s


def check_ttl(quota: Quota, ttl_s: int | None) -> None:
    if ttl_s is not None and ttl_s > quota.max_ttl_s:
        raise InvalidArgument(
            f"ttl_seconds {ttl_s} is above this workspace's maximum of {quota.max_ttl_s}",
            details={"ttl_seconds": ttl_s, "max_ttl_seconds": quota.max_ttl_s},
        )


def _require(resource: str, limit: int, used: int, requested: int) -> None:
    if used + requested > limit:
        _refuse(resource, limit, used, requested)


def _refuse(resource: str, limit: int, used: int, requested: int) -> NoReturn:
    raise WorkspaceQuotaExceeded(
        f"workspace quota exceeded: {resource} limit {limit}, {used} used, {requested} requested",
        details={"resource": resource, "limit": limit, "used": used, "requested": requested},
    )
