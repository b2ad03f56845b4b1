"""Recipe builds' step layers in the object store, shared by the fleet and kept under a byte budget.

A host that built a step publishes its layer (a qcow2 file QEMU wrote; the host only moves it)::

    build-steps/<key>/<sha256>.qcow2    the layer's bytes as uploaded (named by their sha256: two hosts racing to
                                        publish one key never overwrite each other's bytes)
    build-steps/<key>/meta.json         written last: which layer object, its size and sha256, the layer's
                                        version, its parent (key and version) or, for the first layer of a chain,
                                        the identity of the raw base image under it; created and last used

A layer is a diff over exactly one parent: ``version`` names the content of a layer wherever it is copied (the
sha256 of the file its building host cut), and a child records its parent's version, so a host stacks a stored
layer only on the very parent it was built on. A key is usable while its meta exists, names a layer object, and
its parent's meta (up to the base) has the version it records; anything else is a miss.

Budget (``CRYOBOX_BUILD_CACHE_STORE_BYTES``, default 50 GiB): :func:`plan_steps` removes least recently used
first, where a layer counts as used as recently as its most recently used descendant (removing a parent breaks its
children, so they go with it, deepest first). ``last_used`` is rewritten at most once per :data:`TOUCH_S` per key.
It also removes broken chains (a parent gone or of another version), unreadable metas and layer objects no meta
names (an upload that died, a race's loser) older than the grace period. An entry is deleted meta first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ..errors import ObjectNotFound, StoreError
from .client import ObjectMeta, ObjectStore
from .keys import BUILD_STEPS, STEP_META, build_step_layer, build_step_meta

STEP_BYTES_ENV = "CRYOBOX_BUILD_CACHE_STORE_BYTES"
DEFAULT_STEP_BYTES = 50 << 30
TOUCH_S = 3600.0
"""``last_used`` is rewritten at most this often per key."""
FORMAT = 1


def store_budget(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(STEP_BYTES_ENV, "")
    return int(raw) if raw.strip() else DEFAULT_STEP_BYTES


@dataclass(frozen=True)
class StepMeta:
    key: str
    version: str
    size: int
    sha256: str
    parent: str | None
    parent_version: str | None
    base: str | None
    """The identity of the raw image under the first layer of a chain (``None`` for every other layer)."""
    created: float
    last_used: float
    format: int = FORMAT

    @property
    def layer_key(self) -> str:
        return build_step_layer(self.key, self.sha256)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, key: str, blob: bytes) -> StepMeta:
        try:
            body = json.loads(blob)
            meta = cls(**{name: body[name] for name in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError) as err:
            raise StoreError(f"unreadable build step meta of {key}: {err}", details={"key": key}) from err
        ok = (
            meta.key == key
            and meta.format == FORMAT
            and isinstance(meta.size, int)
            and isinstance(meta.sha256, str)
            and len(meta.sha256) == 64
            and isinstance(meta.version, str)
            and (meta.parent is None) == (meta.parent_version is None) != (meta.base is None)
            and isinstance(meta.last_used, int | float)
        )
        if not ok:
            raise StoreError(f"malformed build step meta of {key}", details={"key": key})
        return meta


def read_meta(store: ObjectStore, key: str) -> StepMeta | None:
    """The meta of ``key`` (``None`` when there is none; ``StoreError`` when it cannot be read or parsed)."""
    try:
        blob = store.get(build_step_meta(key))
    except ObjectNotFound:
        return None
    return StepMeta.from_bytes(key, blob)


@dataclass
class StepEntry:
    """One key's objects as listed, and its meta once read (``unreadable``: reading failed, ``malformed``: it
    does not parse)."""

    key: str
    objects: list[ObjectMeta] = field(default_factory=list)
    meta: StepMeta | None = None
    unreadable: bool = False
    malformed: bool = False

    @property
    def listed_meta(self) -> ObjectMeta | None:
        return next((m for m in self.objects if m.key.endswith(f"/{STEP_META}")), None)

    @property
    def size(self) -> int:
        return sum(m.size for m in self.objects)


def group_steps(listed: list[ObjectMeta]) -> dict[str, StepEntry]:
    """The ``build-steps/`` objects of a listing, by step key."""
    entries: dict[str, StepEntry] = {}
    for meta in listed:
        parts = meta.key.split("/")
        if len(parts) == 3 and parts[0] == BUILD_STEPS:
            entries.setdefault(parts[1], StepEntry(parts[1])).objects.append(meta)
    return entries


def read_metas(store: ObjectStore, entries: dict[str, StepEntry]) -> list[str]:
    """Read every listed meta into its entry; the problems (metas that could not be read)."""
    problems = []
    for entry in entries.values():
        if entry.listed_meta is None:
            continue
        try:
            blob = store.get(build_step_meta(entry.key))
        except ObjectNotFound:
            continue  # deleted since the listing
        except StoreError as err:
            entry.unreadable = True
            problems.append(f"build step meta {entry.key} cannot be read ({err.message})")
            continue
        try:
            entry.meta = StepMeta.from_bytes(entry.key, blob)
        except StoreError:
            entry.malformed = True
    return problems


@dataclass(frozen=True)
class StepRemoval:
    key: str
    size: int
    reason: str  # "budget" | "broken" | "stray"


def plan_steps(entries: dict[str, StepEntry], budget: int, now: float, grace_s: float) -> list[StepRemoval]:
    """Which objects to delete (metas first, children before parents) to leave only usable chains within
    ``budget`` bytes (see the module doc). While any meta cannot be read, only strays go. Pure; ``now`` is the
    wall clock."""
    old = now - grace_s
    unsafe = any(e.unreadable for e in entries.values())
    removals: list[StepRemoval] = []

    def drop(entry: StepEntry, reason: str) -> None:
        listed = entry.listed_meta
        removals.extend(StepRemoval(m.key, m.size, reason) for m in ([listed] if listed else []))
        removals.extend(StepRemoval(m.key, m.size, reason) for m in entry.objects if m is not listed)

    usable = {
        e.key: e.meta
        for e in entries.values()
        if e.meta is not None and any(m.key == e.meta.layer_key for m in e.objects)
    }
    depth = _depths(usable)
    for entry in entries.values():
        if entry.key in depth:
            named = (usable[entry.key].layer_key, build_step_meta(entry.key))
            strays = [m for m in entry.objects if m.key not in named and _modified(m, now) <= old]
            removals.extend(StepRemoval(m.key, m.size, "stray") for m in strays)
        elif entry.unreadable:
            continue
        elif entry.key in usable:
            if not unsafe:
                drop(entry, "broken")  # its parent is gone or of another version
        elif _newest(entry, now) <= old:
            # layer objects of an upload that never wrote its meta; a meta that does not parse or names no layer
            drop(entry, "stray" if entry.listed_meta is None else "broken")
    if unsafe:
        return removals
    kept = [e for e in entries.values() if e.key in depth]
    total = sum(e.size for e in kept) - sum(r.size for r in removals if r.key.split("/")[1] in depth)
    used = _effective_used(usable, depth)
    for entry in sorted(kept, key=lambda e: (used[e.key], -depth[e.key], e.key)):
        if total <= budget:
            break
        removing = {r.key for r in removals}
        total -= sum(m.size for m in entry.objects if m.key not in removing)
        removals = [r for r in removals if r.key.split("/")[1] != entry.key]
        drop(entry, "budget")
    return removals


def _depths(usable: dict[str, StepMeta]) -> dict[str, int]:
    """Keys whose chain reaches a base through parents of the versions they record: key -> depth (root 0)."""
    depth: dict[str, int] = {}

    def walk(key: str, seen: frozenset[str]) -> int | None:
        if key in depth:
            return depth[key]
        meta = usable.get(key)
        if meta is None or key in seen:
            return None
        if meta.parent is None:
            depth[key] = 0
            return 0
        parent = usable.get(meta.parent)
        if parent is None or parent.version != meta.parent_version:
            return None
        above = walk(meta.parent, seen | {key})
        if above is None:
            return None
        depth[key] = above + 1
        return depth[key]

    for key in usable:
        walk(key, frozenset())
    return depth


def _effective_used(usable: dict[str, StepMeta], depth: dict[str, int]) -> dict[str, float]:
    """A layer is as recently used as its most recently used descendant."""
    used = {key: float(usable[key].last_used) for key in depth}
    for key in sorted(depth, key=lambda k: -depth[k]):
        parent = usable[key].parent
        if parent is not None and parent in used:
            used[parent] = max(used[parent], used[key])
    return used


def _modified(meta: ObjectMeta, now: float) -> float:
    return meta.last_modified if meta.last_modified is not None else now


def _newest(entry: StepEntry, now: float) -> float:
    return max((_modified(m, now) for m in entry.objects), default=now)


def trim_steps(store: ObjectStore, budget: int, now: float, grace_s: float = 3600.0) -> list[StepRemoval]:
    """List ``build-steps/`` and, when it holds more than ``budget`` bytes, delete what :func:`plan_steps` says
    (metas are read only then); what was deleted."""
    entries = group_steps(store.list_meta(BUILD_STEPS))
    if sum(e.size for e in entries.values()) <= budget:
        return []
    read_metas(store, entries)
    done = []
    for removal in plan_steps(entries, budget, now, grace_s):
        store.delete(removal.key)
        done.append(removal)
    return done


__all__ = [
    "BUILD_STEPS",
    "DEFAULT_STEP_BYTES",
    "STEP_BYTES_ENV",
    "TOUCH_S",
    "StepEntry",
    "StepMeta",
    "StepRemoval",
    "group_steps",
    "plan_steps",
    "read_meta",
    "read_metas",
    "store_budget",
    "trim_steps",
]
