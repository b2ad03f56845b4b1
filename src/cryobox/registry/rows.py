"""Registry rows (frozen dataclasses handed out instead of ORM objects) and their ORM conversion/validation."""

from __future__ import annotations

import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from ..errors import InvalidArgument
from . import models as m

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
    cpu: int
    memory_mb: int
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
    cpu: int
    memory_mb: int
    status: str = "starting"
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    from_snapshot: str | None = None
    boot_ms: float = 0.0
    boot_mode: str = "restore"
    host: str = ""
    created_at: float = field(default_factory=time.time)
    persistent: bool = False
    ttl_seconds: int | None = None
    expires_at: float | None = None
    last_active_at: float = field(default_factory=time.time)
    vm_id: str | None = None
    guest_ip: str | None = None
    instance_id: str | None = None


@dataclass(frozen=True)
class SnapshotRow:
    id: str
    workspace_id: str
    template: str
    path: str
    sandbox_id: str | None = None
    parent_id: str | None = None
    size_bytes: int = 0
    pause_ms: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    retain: bool = False
    created_at: float = field(default_factory=time.time)
    orphaned_at: float | None = None


@dataclass(frozen=True)
class ReconcileReport:
    deleted_snapshots: list[str] = field(default_factory=list)
    """Snapshot rows removed because their files are gone."""
    stopped_sandboxes: list[str] = field(default_factory=list)
    """Sandbox rows marked ``stopped`` because their VM did not survive the restart."""


STOPPED_STATUSES = ("stopped", "error")
_IMMUTABLE = frozenset({"id", "workspace_id"})
_CHUNK = 500  # ids per IN (...) clause

_Row = TypeVar("_Row", SandboxRow, SnapshotRow, TemplateRow)

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
        if isinstance(value, dict):
            value = dict(value)
        elif hint is float or hint == float | None:
            value = None if value is None else float(value)
        checked[name] = value
    return checked


def _to_orm(row: _Row, orm_cls: type[m.Base]) -> m.Base:
    values = _check_fields(type(row), {f.name: getattr(row, f.name) for f in fields(row)})
    return orm_cls(**{_attr(name): value for name, value in values.items()})


def _from_orm(obj: m.Base, cls: type[_Row]) -> _Row:
    values: dict[str, Any] = {}
    for f in fields(cls):
        value = getattr(obj, _attr(f.name))
        values[f.name] = dict(value) if isinstance(value, dict) else value
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
