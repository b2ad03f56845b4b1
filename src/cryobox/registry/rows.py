"""Registry rows (frozen dataclasses handed out instead of ORM objects) and their ORM conversion/validation."""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from ..errors import InvalidArgument
from ..netpolicy import EgressPolicy, legacy_policy
from . import models as m

log = logging.getLogger(__name__)

ON_TIMEOUT_KILL = "kill"
ON_TIMEOUT_HIBERNATE = "hibernate"
ON_TIMEOUT_ACTIONS = (ON_TIMEOUT_KILL, ON_TIMEOUT_HIBERNATE)
"""What a sandbox's TTL expiry does (:attr:`SandboxRow.on_timeout`)."""

# ---------------------------------------------------------------------------------------------------------------
# rows


@dataclass(frozen=True)
class WorkspaceInfo:
    id: str
    name: str
    created_at: float


@dataclass(frozen=True)
class ApiKeyInfo:
    """An API key as listed: never the hash, never the plaintext."""

    id: str
    workspace_id: str
    name: str
    prefix: str
    created_at: float
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True)
class TemplateRow:
    name: str
    generation: str
    cpus: int
    memory_mib: int
    status: str
    path: str
    created_at: float = field(default_factory=time.time)
    workspace_id: str | None = None  # None: built-in, visible to every workspace
    spec: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class SandboxRow:
    id: str
    workspace_id: str
    template: str
    cpus: int
    memory_mib: int
    status: str = "starting"
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    from_snapshot: str | None = None
    boot_ms: float = 0.0
    boot_mode: str = "restore"
    host: str = ""
    created_at: float = field(default_factory=time.time)
    persistent: bool = False
    ttl_s: int | None = None
    expires_at: float | None = None
    last_active_at: float = field(default_factory=time.time)
    vm_id: str | None = None
    guest_ip: str | None = None
    instance_id: str | None = None
    hibernation: str | None = None
    """``local`` (a hibernated sandbox whose image only its host has), ``stored`` (in the object store as well:
    any agent serving ``hibernation_generation`` can wake it), ``None`` (not hibernated)."""
    hibernation_generation: str | None = None
    egress: EgressPolicy | None = None
    """The network policy (``None``: nothing allowed); stored as its JSON mapping (:func:`_stored`)."""
    hibernation_manifest_sha256: str | None = None
    """The sha256 of the stored hibernation's manifest (revision 0007): a wake elsewhere refuses any other bytes;
    ``None`` for a stored hibernation from before manifests were pinned (trusted as fetched, with a warning)."""
    on_timeout: str = ON_TIMEOUT_KILL
    """What its TTL's expiry does (revision 0013): ``kill`` (delete it) or ``hibernate`` (keep it, paused)."""
    auto_wake: bool = True
    """Whether any request for it wakes it when hibernated (revision 0013); otherwise only an explicit resume."""
    hibernated_at: float | None = None
    """When it last became hibernated (revision 0013): what the paused retention counts from; ``None`` while it
    is not hibernated (or for a row hibernated before 0013, until the retention sweep first sees it)."""


@dataclass(frozen=True)
class SnapshotRow:
    id: str
    workspace_id: str
    template: str
    path: str
    sandbox_id: str | None = None
    parent_id: str | None = None
    size_bytes: int = 0
    """The allocated size of all its files (what the snapshot-bytes quota counts)."""
    unique_bytes: int = 0
    """Bytes only it holds: the memory pages it changed from its parent image, device state, disk overlay
    (revision 0008; rows from before hold their ``size_bytes`` here)."""
    shared_bytes: int = 0
    """Memory bytes it shares with its parent image: a template generation or another snapshot (revision 0008)."""
    pause_ms: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    retain: bool = False
    created_at: float = field(default_factory=time.time)
    orphaned_at: float | None = None
    host: str = ""
    """The agent that wrote it (empty: rows from before the fleet, or a single host)."""
    location: str = "local"
    """``local``: its files exist only on ``host``; ``stored``: they are in the object store too."""
    generation: str | None = None
    """The template generation it was taken from."""
    manifest_sha256: str | None = None
    """The sha256 of its manifest in the object store (revision 0007), set when it is stored: an import on another
    agent refuses any other bytes; ``None`` for snapshots stored before manifests were pinned (or not yet)."""
    egress: EgressPolicy | None = None
    """The network policy of the sandbox it was taken from (revision 0012), which a create from it that names no
    network inherits; ``None``: nothing allowed (also snapshots from before, and imported ones)."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """The volume mounts of the sandbox it was taken from (revision 0014: ``{volume_id, name, path, read_only}``
    each), which a restore re-attaches; not the volumes' bytes."""


@dataclass(frozen=True)
class AgentRow:
    """A host agent as its last heartbeat described it."""

    name: str
    url: str
    boot_id: str
    status: str
    """``up`` | ``down`` | ``draining``."""
    heartbeat_at: float
    registered_at: float
    capacity: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReservationRow:
    """Room held on an agent between placement and the sandbox row that takes it over."""

    id: str
    agent: str
    memory_mib: int
    cpus: int
    created_at: float
    expires_at: float
    sandbox_id: str | None = None


@dataclass(frozen=True)
class AgentLoad:
    """What the registry holds against one agent, as a placement policy sees it inside a reservation."""

    agent: AgentRow
    committed_memory_mib: int
    """Sum over this host's sandbox rows whose status is in :data:`ACTIVE_STATUSES`."""
    committed_cpus: int
    sandboxes: int
    reserved_memory_mib: int
    """Sum over this agent's unexpired reservations."""
    reserved_cpus: int
    reservations: int

    @property
    def used_memory_mib(self) -> int:
        return self.committed_memory_mib + self.reserved_memory_mib

    @property
    def used_cpus(self) -> int:
        return self.committed_cpus + self.reserved_cpus


@dataclass(frozen=True)
class HeartbeatOutcome:
    new_boot: bool
    """There was no row for the agent, or its boot id changed: the agent restarted (reconcile it)."""
    was_down: bool
    """The agent had been marked ``down`` before this heartbeat."""
    status: str
    """The agent's status after the heartbeat (``up``, or ``draining`` which a heartbeat keeps)."""


@dataclass(frozen=True)
class HostReconcile:
    """What :meth:`FleetRecords.reconcile_host` changed (ids, sorted)."""

    lost: list[str] = field(default_factory=list)
    """Sandbox rows of the host the agent did not report, now marked with the absent status."""
    updated: list[str] = field(default_factory=list)
    """Sandbox rows whose status was set to the one the agent reported."""
    deleted_snapshots: list[str] = field(default_factory=list)
    """Local snapshot rows of the host whose files are gone."""


@dataclass(frozen=True)
class ReconcileReport:
    deleted_snapshots: list[str] = field(default_factory=list)
    """Snapshot rows removed because their files are gone."""
    stopped_sandboxes: list[str] = field(default_factory=list)
    """Sandbox rows marked ``stopped`` because their VM did not survive the restart."""


STOPPED_STATUSES = ("stopped", "error")
ACTIVE_STATUSES = ("starting", "running", "paused")
"""Sandbox statuses that hold memory and vCPUs on their host."""
HIBERNATED = "hibernated"
HIBERNATION_LOCAL = "local"
HIBERNATION_STORED = "stored"
AGENT_UP = "up"
AGENT_DOWN = "down"
AGENT_DRAINING = "draining"
AGENT_STATUSES = (AGENT_UP, AGENT_DOWN, AGENT_DRAINING)
LOST = "lost"
"""A sandbox whose host stopped answering (or no longer reports it); it comes back if the host reports it again."""
_IMMUTABLE = frozenset({"id", "workspace_id"})
_CHUNK = 500  # ids per IN (...) clause

_POLICY_FIELDS: Mapping[type, frozenset[str]] = types.MappingProxyType(
    {SandboxRow: frozenset({"egress"}), SnapshotRow: frozenset({"egress"})}
)
"""The fields of each row class that hold a network policy (an ``EgressPolicy``, stored as its JSON mapping)."""
_Row = TypeVar("_Row", SandboxRow, SnapshotRow, TemplateRow, AgentRow, ReservationRow)

# ---------------------------------------------------------------------------------------------------------------
# row <-> ORM conversion and validation


def _attr(name: str) -> str:
    """ORM attribute of a dataclass field (``metadata`` is reserved on declarative classes)."""
    return "metadata_" if name == "metadata" else name


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:  # a class on 3.11+, but not one isinstance() accepts
        return True
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return any(_matches(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        (item_t,) = get_args(hint)
        return isinstance(value, list) and all(_matches(v, item_t) for v in value)
    if origin is dict:
        key_t, value_t = get_args(hint)
        return isinstance(value, dict) and all(_matches(k, key_t) and _matches(v, value_t) for k, v in value.items())
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _check_fields(cls: type[Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """Values checked against ``cls``'s annotations (SQLite would store anything); ints widened where float."""
    hints = get_type_hints(cls)
    checked: dict[str, Any] = {}
    for name, value in values.items():
        hint = hints[name]
        if not _matches(value, hint):
            raise InvalidArgument(
                f"{cls.__name__}.{name} must be {getattr(hint, '__name__', hint)}, not {type(value).__name__}",
                details={"field": name},
            )
        if isinstance(value, EgressPolicy):
            value = value.model_dump(mode="json")
        elif isinstance(value, dict):
            value = dict(value)
        elif isinstance(value, list):
            value = list(value)
        elif hint is float or hint == float | None:
            value = None if value is None else float(value)
        checked[name] = value
    return checked


def _to_orm(row: _Row, orm_cls: type[m.Base]) -> m.Base:
    values = _check_fields(type(row), {f.name: getattr(row, f.name) for f in fields(row)})
    return orm_cls(**{_attr(name): value for name, value in values.items()})


def _stored_policy(value: Any, where: str) -> EgressPolicy | None:
    """A policy column as stored: a mapping, a list of CIDRs (rows of before policies) or NULL. A value that no
    longer validates reads as ``None`` (nothing allowed), with a warning: the safe side, never a failed read."""
    if value is None:
        return None
    try:
        return EgressPolicy.model_validate(legacy_policy(value))
    except ValueError as err:
        log.warning("%s holds a network policy that does not validate (read as nothing allowed): %s", where, err)
        return None


def _from_orm(obj: m.Base, cls: type[_Row]) -> _Row:
    values: dict[str, Any] = {}
    policies = _POLICY_FIELDS.get(cls, frozenset())
    for f in fields(cls):
        value = getattr(obj, _attr(f.name))
        if f.name in policies:
            values[f.name] = _stored_policy(value, f"{cls.__name__} {getattr(obj, 'id', '?')}.{f.name}")
            continue
        values[f.name] = dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value
    return cls(**values)


def _workspace_info(obj: m.Workspace) -> WorkspaceInfo:
    return WorkspaceInfo(id=obj.id, name=obj.name, created_at=obj.created_at)


def _key_info(obj: m.ApiKey) -> ApiKeyInfo:
    return ApiKeyInfo(
        id=obj.id,
        workspace_id=obj.workspace_id,
        name=obj.name,
        prefix=obj.prefix,
        created_at=obj.created_at,
        revoked_at=obj.revoked_at,
    )


def _subset(want: Mapping[str, str] | None, have: Mapping[str, str]) -> bool:
    return not want or all(k in have and have[k] == v for k, v in want.items())


def _chunks(ids: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


def _changes(cls: type[Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Checked values of an update of some fields of a ``cls`` row (unknown or immutable fields refused)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise InvalidArgument(f"unknown {cls.__name__} field(s): {', '.join(unknown)}", details={"fields": unknown})
    fixed = sorted(set(changes) & _IMMUTABLE)
    if fixed:
        raise InvalidArgument(f"{cls.__name__} field(s) cannot change: {', '.join(fixed)}", details={"fields": fixed})
    if not changes:
        raise InvalidArgument(f"no {cls.__name__} fields to update")
    return _check_fields(cls, changes)
