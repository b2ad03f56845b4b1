"""Who owns a stored snapshot or hibernation: registries announce themselves in the store and claim what they
store there, so that ``cryobox gc --store`` can tell an image whose registry is gone from one a registry lists::

    owners/<registry id>.json              the registry: {"id", "kind": "sqlite"|"postgres", "locator", "machine"}
    owners/<registry id>/<image prefix>    a claim: that registry stored the image (an empty object):
                                           snapshots/<id>, hibernations/<sandbox id>, volumes/<volume id>,
                                           templates/<name> (every generation of a custom template, and its
                                           ``latest``)

A control plane announces its registry when it starts, claims an image *before* it asks an agent to store it (the
row is already in the registry then), and releases the claim after it deleted the stored image. A GC lists the
store first and consults the registries after (:class:`Oracle`, implemented over the registry databases in
:mod:`cryobox.registry.oracle`), so every claim it saw belongs to a row that existed before the consultation. Each
claim then reads as:

- ``listed``: the registry lists the image (its snapshot row, the sandbox of a hibernation, the template, the
  volume row): kept;
- ``unlisted``: the registry is there and lists no such image (a row deleted whose objects stayed: a crash);
- ``gone``: the registry is gone (its SQLite file deleted, or another registry's file in its place);
- ``unknown``: cannot tell (another machine's SQLite file, a PostgreSQL this run was not given, an error): kept.

An image is **disowned** when it has a claim and every claim is ``gone``, or ``unlisted`` for longer than the
grace period. Its objects go like a dead template generation's (the manifest first), then its claims. Images
nobody claims (stored before claims existed) are kept as before: the GC cannot tell whose they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..errors import ObjectNotFound, StoreError
from .client import ObjectMeta, ObjectStore

log = logging.getLogger(__name__)

OWNERS = "owners"
OWNED_ROOTS = (
    "snapshots",
    "hibernations",
    "templates",
    "volumes",
)  # what registries claim (built-in templates: nobody)
RegistryKind = Literal["sqlite", "postgres"]
Verdict = Literal["listed", "unlisted", "gone", "unknown"]


@dataclass(frozen=True)
class RegistryRecord:
    """A registry as it announces itself: its id, its kind and where it is (a SQLite file's absolute path on the
    machine ``machine``; a PostgreSQL URL without its password)."""

    id: str
    kind: RegistryKind
    locator: str
    machine: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "kind": self.kind, "locator": self.locator, "machine": self.machine}

    @classmethod
    def from_json(cls, raw: object) -> RegistryRecord | None:
        if not isinstance(raw, dict):
            return None
        values = [raw.get(k) for k in ("id", "kind", "locator", "machine")]
        if not all(isinstance(v, str) and v for v in values) or raw["kind"] not in ("sqlite", "postgres"):
            return None
        return cls(raw["id"], raw["kind"], raw["locator"], raw["machine"])


@dataclass(frozen=True)
class Listing:
    """What a registry holds, read once per GC run: ``state`` ``live`` with its ids, ``gone``, or ``unknown``."""

    state: Literal["live", "gone", "unknown"]
    snapshots: frozenset[str] = frozenset()
    sandboxes: frozenset[str] = frozenset()
    templates: frozenset[str] = frozenset()
    volumes: frozenset[str] = frozenset()

    def verdict(self, root: str, image_id: str) -> Verdict:
        if self.state != "live":
            return self.state
        ids = {
            "snapshots": self.snapshots,
            "hibernations": self.sandboxes,
            "templates": self.templates,
            "volumes": self.volumes,
        }[root]
        return "listed" if image_id in ids else "unlisted"


UNKNOWN = Listing("unknown")


class Oracle(Protocol):
    def consult(self, record: RegistryRecord) -> Listing:
        """What ``record``'s registry holds now (never raises: ``unknown`` when it cannot tell)."""
        ...


def record_key(registry_id: str) -> str:
    return f"{OWNERS}/{registry_id}.json"


def claim_key(registry_id: str, prefix: str) -> str:
    return f"{OWNERS}/{registry_id}/{prefix.strip('/')}"


def announce(store: ObjectStore, record: RegistryRecord) -> None:
    store.put(record_key(record.id), json.dumps(record.to_json(), sort_keys=True).encode())


def claim(store: ObjectStore, registry_id: str, prefix: str) -> None:
    store.put(claim_key(registry_id, prefix), b"")


def release(store: ObjectStore, registry_id: str, prefix: str) -> None:
    try:
        store.delete(claim_key(registry_id, prefix))
    except ObjectNotFound:
        pass


@dataclass
class Judgement:
    """What the owners of a store's images say, for one GC run."""

    disowned: set[str] = field(default_factory=set)  # image prefixes to delete whole
    claims: dict[str, list[ObjectMeta]] = field(default_factory=dict)  # image prefix -> its claims
    stale: list[ObjectMeta] = field(default_factory=list)  # claims of images no longer stored, records of gone
    verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)  # image prefix -> registry id -> verdict


def judge(
    store: ObjectStore,
    owned: Iterable[ObjectMeta],
    images: set[str],
    oracle: Oracle,
    now: float,
    grace_s: float,
) -> Judgement:
    """Read the records among ``owned`` (the listed ``owners/`` objects), consult each registry once, and judge
    every claimed image; ``images`` are the image prefixes the listing holds (with or without a manifest; a
    template's are its generations')."""
    records: dict[str, ObjectMeta] = {}
    claims: dict[str, list[tuple[str, ObjectMeta]]] = {}
    for meta in owned:
        rest = meta.key.removeprefix(f"{OWNERS}/")
        if "/" not in rest and rest.endswith(".json"):
            records[rest.removesuffix(".json")] = meta
            continue
        registry_id, _, prefix = rest.partition("/")
        if prefix.split("/")[0] in OWNED_ROOTS and prefix.count("/") == 1:
            claims.setdefault(prefix, []).append((registry_id, meta))
    listings = {rid: _consult(store, meta, oracle) for rid, meta in records.items()}
    out = Judgement()
    old = now - grace_s
    present = set(images) | {template_of(p) for p in images if p.startswith("templates/")}
    for prefix, owners in claims.items():
        out.claims[prefix] = [meta for _, meta in owners]
        if prefix not in present:  # the image went (deleted by its registry, or by an earlier run): its claims go
            out.stale += [meta for _, meta in owners if _modified(meta, now) <= old]
            continue
        root, image_id = prefix.split("/")
        verdicts = {rid: listings.get(rid, UNKNOWN).verdict(root, image_id) for rid, _ in owners}
        out.verdicts[prefix] = verdicts
        if all(_let_go(verdicts[rid], meta, now, old) for rid, meta in owners):
            out.disowned.add(prefix)
    claimed = {rid for owners in claims.values() for rid, _ in owners}
    out.stale += [
        meta
        for rid, meta in records.items()
        if rid not in claimed and listings[rid].state == "gone" and _modified(meta, now) <= old
    ]
    return out


def template_of(prefix: str) -> str:
    """``templates/<name>`` of a generation's prefix (``templates/<name>/<generation>``); others unchanged."""
    return "/".join(prefix.split("/")[:2])


def _let_go(verdict: Verdict, claim_meta: ObjectMeta, now: float, old: float) -> bool:
    """A claim that no longer holds its image: its registry is gone, or has not listed the image for a grace."""
    return verdict == "gone" or (verdict == "unlisted" and _modified(claim_meta, now) <= old)


def _consult(store: ObjectStore, meta: ObjectMeta, oracle: Oracle) -> Listing:
    try:
        record = RegistryRecord.from_json(json.loads(store.get(meta.key)))
    except (ObjectNotFound, StoreError, ValueError):
        record = None
    if record is None:
        log.warning("registry record %s cannot be read: its images are kept", meta.key)
        return UNKNOWN
    return oracle.consult(record)


def _modified(meta: ObjectMeta, now: float) -> float:
    return meta.last_modified if meta.last_modified is not None else now
