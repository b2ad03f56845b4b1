"""``cryobox gc --store``: delete what no live image needs from the object store.

An image (a template generation, a snapshot, a stored hibernation) is **live** while its ``manifest.json`` exists.
A run (:func:`collect`) scans the store (:mod:`.gcscan`) and removes, in this order:

1. **old template generations** nothing needs: not among the newest ``keep_generations`` of their template (by
   ``published_at``), not the one ``templates/<name>/latest`` names, not the one a live snapshot's or
   hibernation's manifest sits on (an import rebases onto that template's disk), not named by a fresh lease, and
   out of the newest ``keep_generations`` for at least the grace period. The manifest goes first, so a run killed
   half-way leaves a manifest-less leftover, never a live image with objects missing;
   With an oracle (:mod:`.owners`), **disowned snapshots and hibernations** go the same way: stored images whose
   every claiming registry is gone or no longer lists them (consulted after the listing), then their claims;
2. **leftovers of images without a manifest** (a publish that died, a deletion cut short) whose every object is
   older than the grace period and that no fresh lease names (a publish in progress has no manifest yet);
3. **format-1 packs** (``memory.pack``, ``images/**.pack``) beside an index that has been published again in the
   current format, older than the grace period; and **recipe root filesystems** (``images/rootfs-recipe/``, made
   for one template) that no manifest staying in the store names, all of them older than the grace period;
4. **chunk objects** that no index of a live or base image names and no fresh lease names, older than the grace
   period. A chunk a live index names is never deleted: the referenced set is taken from every live index
   before any deletion, and only grows;
5. expired leases and markers of GCs that died (older than the grace period);
6. **build step layers** (:mod:`.buildsteps`) beyond the step cache's budget (``step_budget``, by default
   ``CRYOBOX_BUILD_CACHE_STORE_BYTES`` or 50 GiB), least recently used first with their descendants; broken
   chains; layer objects no meta names, older than the grace period. Nothing else refers to them.

Concurrent publishes are safe by the lease protocol of :mod:`.leases`: this run announces itself under ``gc/``
before it lists ``leases/``, keeps whatever a fresh lease names, and sends each delete within ``GC_WINDOW_S`` of
starting the ``leases/`` listing it decided on (it lists again otherwise). It stops deleting once half the grace
period has passed (the next run carries on). The chunk-age grace is a second guard: a publish uploads its chunks
before its index, so an unreferenced chunk younger than the grace period may be one whose index is on its way.

Why ``keep_generations`` = 2: a re-bake publishes generation N+1 while hosts still run N (their pooled and
lazily paged VMs fault N's chunks in, imports of N's snapshots rebase onto N's disk) until they restart onto
``latest``; keeping the previous generation as well covers one rollout (and one rollback), the grace period
covers a host that fetched ``latest`` just before it moved. A host still lazily paging an older generation
loses it; in the default ``--memory hot`` a fetched template's memory is brought home, so only lazy hosts page.

A run killed at any instant (``kill -9``) leaves every live image whole: it deletes only objects of images that
are not live (their manifest first), legacy packs, unreferenced chunks, and protocol objects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InvalidArgument, ObjectNotFound, StoreError
from .buildsteps import DEFAULT_STEP_BYTES, StepRemoval, plan_steps
from .client import ObjectMeta, ObjectStore
from .gcgenerations import dead_generations
from .gcowners import disowned_groups, holds, let_go, owned_objects
from .gcreport import KINDS, GcReport, Removal
from .gcscan import MANIFEST, ImageGroup, StoreView, scan
from .leases import GC_WINDOW_S, GcMarker, Leases, read_leases
from .owners import OWNERS, Judgement, Oracle, judge

__all__ = ["KINDS", "GcClock", "GcPlan", "GcPolicy", "GcReport", "Removal", "collect", "plan"]

log = logging.getLogger(__name__)

COLLECTABLE_IMAGES = ("images/rootfs-recipe/", "images/rootfs/")
"""Root filesystems, collected once no manifest names them: a recipe template's (made for it alone), and the
built-ins' of earlier image versions (each change of a built-in's packages or of the image builder makes a new one,
~450 MiB; the generations that named the old ones are gone). The others (kernels, initramfs, the build VM's root
filesystem, which no manifest names) are shared roots and always kept."""


@dataclass(frozen=True)
class GcPolicy:
    grace_s: float = 3600.0
    keep_generations: int = 2
    dry_run: bool = False
    window_s: float = GC_WINDOW_S
    step_budget: int = DEFAULT_STEP_BYTES

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.keep_generations < 1 or self.window_s <= 0 or self.step_budget < 0:
            raise InvalidArgument("grace must be >= 0, keep_generations >= 1, the window > 0, the step budget >= 0")


@dataclass(frozen=True)
class GcClock:
    wall: Callable[[], float] = time.time  # compared with the store's last-modified times
    mono: Callable[[], float] = time.monotonic  # the lease window and the run's own duration


@dataclass
class GcPlan:
    generations: list[ImageGroup]  # dead template generations, to delete whole (manifest first)
    disowned: list[ImageGroup]  # stored images no registry holds any more (:mod:`.owners`), deleted the same way
    owned: dict[str, list[ObjectMeta]]  # claimed prefix let go -> its claims (and a template's latest), deleted
    # once nothing under the prefix is left
    stale: list[ObjectMeta]  # claims of images no longer stored, records of registries gone
    listed: set[str]  # every image prefix the scan found
    strays: list[ImageGroup]
    legacy: list[ObjectMeta]
    chunk_candidates: dict[str, ObjectMeta]  # unreferenced (unless a kept generation names them), old enough
    protected: set[str]  # digests every live image that stays (and every fresh lease) names
    expired: list[ObjectMeta]  # leases and dead GCs' markers
    notes: list[str]
    steps: list[StepRemoval] = field(default_factory=list)  # build step objects (metas first, children first)
    images: list[ObjectMeta] = field(default_factory=list)  # recipe root filesystems no manifest names any more
    image_chunks: set[str] = field(default_factory=set)  # what their indexes name (kept if a delete fails)


def plan(
    view: StoreView,
    leases: Leases,
    now: float,
    policy: GcPolicy,
    own_marker: str = "",
    owners: Judgement | None = None,
) -> GcPlan:
    """What to remove, from a scan, the fresh leases and what the registries say of the images they claimed
    (``owners``; ``None``: none consulted, every stored snapshot kept) (pure; ``now`` is the wall clock)."""
    old = now - policy.grace_s
    notes = list(view.problems) + [f"lease {key} cannot be read" for key in leases.unreadable]
    unsafe = bool(notes)
    owners = owners or Judgement()
    live = {p: g for p, g in view.groups.items() if g.has_manifest}
    dead = [] if unsafe else dead_generations(view, live, leases, old, policy.keep_generations)
    disowned = [] if unsafe else disowned_groups(live, owners, leases)
    disowned = [g for g in disowned if g.prefix not in {d.prefix for d in dead}]
    dead_prefixes = {g.prefix for g in dead + disowned}
    protected = set(leases.chunks)
    for group in live.values():
        if group.prefix not in dead_prefixes:
            protected |= group.index.digests
    orphans = [] if unsafe else _orphan_images(view, live, dead_prefixes, leases, old, now)
    gone = {m.key for m in orphans}
    for key, refs in view.base_indexes.items():
        if key not in gone:
            protected |= refs.digests
    strays = [
        g
        for g in view.groups.values()
        if not g.has_manifest
        and (g.newest <= old or let_go(g.prefix, owners))
        and not leases.names_prefix(g.prefix)
        and not leases.unreadable
    ]
    candidates: dict[str, ObjectMeta] = {}
    if not unsafe:
        candidates = {sha: m for sha, m in view.chunks.items() if sha not in protected and _modified(m, now) <= old}
    expired = [m for m in view.leases if m.key in leases.expired]
    expired += [m for m in view.markers if m.key != own_marker and _modified(m, now) <= old]
    return GcPlan(
        generations=dead,
        disowned=disowned,
        owned={} if unsafe else owned_objects(view, owners),
        stale=owners.stale,
        listed=set(view.groups),
        strays=strays,
        legacy=[m for m in view.legacy_packs if _modified(m, now) <= old],
        chunk_candidates=candidates,
        protected=protected,
        expired=expired,
        notes=notes + ([] if not unsafe else ["no chunk or template generation deleted this run"]) + view.step_problems,
        steps=plan_steps(view.steps, policy.step_budget, now, policy.grace_s),
        images=orphans,
        image_chunks={d for key, refs in view.base_indexes.items() if key in gone for d in refs.digests},
    )


def _image_dir(key: str) -> str:
    """``images/<kind>/<cache key>``: the content-addressed image a key under ``images/`` belongs to."""
    return "/".join(key.split("/")[:3])


def _orphan_images(
    view: StoreView, live: dict[str, ImageGroup], dead: set[str], leases: Leases, old: float, now: float
) -> list[ObjectMeta]:
    """Objects of collectable base images (:data:`COLLECTABLE_IMAGES`) that no manifest staying in the store names
    (by the image's directory), no lease names, and nothing of which is younger than the grace period. A staying
    template whose manifest names no files (an earlier layout) may sit on any built-in root filesystem: then none
    of those is collected."""
    named: set[str] = set()
    collectable: tuple[str, ...] = COLLECTABLE_IMAGES
    for group in live.values():
        if group.prefix in dead:
            continue
        files = (group.manifest or {}).get("files")
        if isinstance(files, dict):
            named |= {_image_dir(str(key)) for key in files.values()}
        elif group.kind == "templates":
            collectable = tuple(c for c in collectable if c != "images/rootfs/")
    by_dir: dict[str, list[ObjectMeta]] = {}
    for meta in view.base:
        if meta.key.startswith(collectable):
            by_dir.setdefault(_image_dir(meta.key), []).append(meta)
    orphans: list[ObjectMeta] = []
    for directory, objects in by_dir.items():
        fresh = any(_modified(m, now) > old for m in objects)
        if directory not in named and not fresh and not leases.names_prefix(directory):
            orphans += sorted(objects, key=lambda m: not m.key.endswith(".idx"))  # the index first
    return orphans


def _modified(meta: ObjectMeta, now: float) -> float:
    """When ``meta`` was last modified (an object without a time counts as new)."""
    return meta.last_modified if meta.last_modified is not None else now


class _Fence:
    """Re-reads ``leases/`` whenever its last listing started more than the window ago; ends the run's deleting
    once half the grace period has passed."""

    def __init__(self, store: ObjectStore, leases: Leases, listed_at: float, policy: GcPolicy, clock: GcClock):
        self.store, self.leases, self.listed_at, self.policy, self.clock = store, leases, listed_at, policy, clock
        self.started = listed_at

    def open(self) -> bool:
        """Whether a delete may be sent now (leases re-read first if needed); ``False``: stop deleting."""
        now = self.clock.mono()
        if self.policy.grace_s and now - self.started >= self.policy.grace_s / 2:
            return False  # a lease put after the first listing could be taken for stale on the next one
        if now - self.listed_at >= self.policy.window_s:
            self.listed_at = now
            read_leases(self.store, self.clock.wall(), self.policy.grace_s, self.leases)
        return not self.leases.unreadable


def collect(
    store: ObjectStore, policy: GcPolicy | None = None, clock: GcClock | None = None, oracle: Oracle | None = None
) -> GcReport:
    """One GC run over ``store`` (see the module doc); with ``policy.dry_run`` nothing is written or deleted.
    With an ``oracle``, the registries that claimed stored snapshots and hibernations are consulted (after the
    listing: see :mod:`.owners`) and what none of them holds any more goes too."""
    policy = policy or GcPolicy()
    clock = clock or GcClock()
    report = GcReport(store.url, policy.dry_run)
    if policy.dry_run:
        leases = read_leases(store, clock.wall(), policy.grace_s)
        view = scan(store)
        todo = plan(view, leases, clock.wall(), policy, owners=_judge(store, view, oracle, clock, policy))
        _would(report, todo)
        return _summarise(report, view, todo)
    with GcMarker(store) as marker:
        listed_at = clock.mono()
        leases = read_leases(store, clock.wall(), policy.grace_s)
        view = scan(store)
        owners = _judge(store, view, oracle, clock, policy)
        todo = plan(view, leases, clock.wall(), policy, marker.key, owners)
        _apply(store, todo, _Fence(store, leases, listed_at, policy, clock), report)
    return _summarise(report, view, todo, marker.key)


def _judge(
    store: ObjectStore, view: StoreView, oracle: Oracle | None, clock: GcClock, policy: GcPolicy
) -> Judgement | None:
    if oracle is None:
        return None
    return judge(store, view.owners, set(view.groups), oracle, clock.wall(), policy.grace_s)


def _would(report: GcReport, todo: GcPlan) -> None:
    for group in todo.generations:
        report.removed += [Removal(m.key, m.size, "generation", group.prefix) for m in _manifest_first(group)]
    for group in todo.disowned:
        report.removed += [Removal(m.key, m.size, "disowned", group.prefix) for m in _manifest_first(group)]
    for group in todo.strays:
        report.removed += [Removal(m.key, m.size, "stray", group.prefix) for m in group.objects]
    gone = {g.prefix for g in todo.disowned + todo.strays}
    left = [m for p, metas in todo.owned.items() if not holds(todo.listed - gone, p) for m in metas] + todo.stale
    report.removed += [Removal(m.key, m.size, "claim" if m.key.startswith(f"{OWNERS}/") else "disowned") for m in left]
    report.removed += [Removal(m.key, m.size, "legacy") for m in todo.legacy]
    report.removed += [Removal(m.key, m.size, "image") for m in todo.images]
    report.removed += [Removal(m.key, m.size, "chunk") for m in todo.chunk_candidates.values()]
    report.removed += [Removal(m.key, m.size, _protocol_kind(m.key)) for m in todo.expired]
    report.removed += [Removal(r.key, r.size, "step") for r in todo.steps]


def _apply(store: ObjectStore, todo: GcPlan, fence: _Fence, report: GcReport) -> None:
    kept_generations: list[ImageGroup] = []
    for group in todo.generations:
        if not _delete_group(store, group, "generation", fence, report):
            kept_generations.append(group)
    gone: list[str] = []
    for group in todo.disowned:
        if _delete_group(store, group, "disowned", fence, report):
            gone.append(group.prefix)
        else:
            kept_generations.append(group)
    for group in todo.strays:
        if _delete_group(store, group, "stray", fence, report):
            gone.append(group.prefix)
    remaining = todo.listed - set(gone)
    left = [m for p, metas in todo.owned.items() if not holds(remaining, p) for m in metas] + todo.stale
    for meta in left:
        kind = "claim" if meta.key.startswith(f"{OWNERS}/") else "disowned"  # or a template's `latest`
        if not _delete(store, Removal(meta.key, meta.size, kind), fence, report):
            break
    for meta in todo.legacy:
        if not _delete(store, Removal(meta.key, meta.size, "legacy"), fence, report):
            break
    protected = set(todo.protected)
    for group in kept_generations:  # its manifest is still there: it is live
        protected |= group.index.digests
    for meta in todo.images:
        if fence.open() and fence.leases.names_prefix(_image_dir(meta.key)):
            report.skipped.append(f"{_image_dir(meta.key)}: named by a lease that appeared during the run")
            protected |= todo.image_chunks
            break
        if not _delete(store, Removal(meta.key, meta.size, "image"), fence, report):
            protected |= todo.image_chunks  # an image stays (the run stopped): every orphan's chunks stay too
            break
    for sha, meta in todo.chunk_candidates.items():
        if sha in protected:
            continue
        if not fence.open():
            report.complete = False
            break
        if sha in fence.leases.chunks:
            report.skipped.append(f"chunk {sha}: named by a lease that appeared during the run")
            continue
        if not _delete(store, Removal(meta.key, meta.size, "chunk"), fence, report, checked=True):
            break
    for meta in todo.expired:
        if _still_expired(store, meta, fence):
            _delete(store, Removal(meta.key, meta.size, _protocol_kind(meta.key)), fence, report)
    for step in todo.steps:
        if not _delete(store, Removal(step.key, step.size, "step"), fence, report):
            break


def _still_expired(store: ObjectStore, meta: ObjectMeta, fence: _Fence) -> bool:
    """An expired lease (or dead GC's marker) has not been put again since it was listed."""
    try:
        now = store.probe(meta.key)
    except StoreError:
        return False
    return (
        now is not None
        and now.last_modified == meta.last_modified
        and ((now.last_modified or 0.0) <= fence.clock.wall() - fence.policy.grace_s)
    )


def _delete_group(store: ObjectStore, group: ImageGroup, kind: str, fence: _Fence, report: GcReport) -> bool:
    """Delete every object of ``group``, the manifest first; ``False`` if a lease came to name it (or the run
    had to stop) before its manifest went."""
    for n, meta in enumerate(_manifest_first(group)):
        if not fence.open():
            report.complete = False
            return n > 0
        if fence.leases.names_prefix(group.prefix):
            report.skipped.append(f"{group.prefix}: named by a lease that appeared during the run")
            return n > 0
        if not _delete(store, Removal(meta.key, meta.size, kind, group.prefix), fence, report, checked=True):
            return n > 0
    return True


def _delete(store: ObjectStore, removal: Removal, fence: _Fence, report: GcReport, *, checked: bool = False) -> bool:
    if not checked and not fence.open():
        report.complete = False
        return False
    try:
        store.delete(removal.key)
    except ObjectNotFound:
        pass
    except StoreError as err:
        report.notes.append(f"could not delete {removal.key}: {err.message}")
        report.complete = False
        return False
    report.removed.append(removal)
    return True


def _manifest_first(group: ImageGroup) -> list[ObjectMeta]:
    return sorted(group.objects, key=lambda m: not m.key.endswith(f"/{MANIFEST}"))


def _protocol_kind(key: str) -> str:
    return "lease" if key.startswith("leases/") else "marker"


def _summarise(report: GcReport, view: StoreView, todo: GcPlan, own_marker: str = "") -> GcReport:
    gone = {r.key for r in report.removed} | {own_marker}
    kept = [m for m in view.listed if m.key not in gone]
    report.kept_objects, report.kept_bytes = len(kept), sum(m.size for m in kept)
    referenced = set(todo.protected)
    for group in todo.generations + todo.disowned:
        if not any(r.group == group.prefix for r in report.removed):
            referenced |= group.index.digests
    report.chunks_referenced = len(referenced)
    report.chunks_missing = sorted(referenced - set(view.chunks) - _leased_only(todo, view))
    report.notes = todo.notes + report.notes
    return report


def _leased_only(todo: GcPlan, view: StoreView) -> set[str]:
    """Digests only a lease names (a publish still uploading them): not missing."""
    indexed: set[str] = set()
    for group in view.groups.values():
        if group.has_manifest:
            indexed |= group.index.digests
    for refs in view.base_indexes.values():
        indexed |= refs.digests
    return todo.protected - indexed
