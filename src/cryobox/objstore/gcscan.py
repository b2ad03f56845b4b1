"""What a store GC sees: the store's objects grouped into images, with what their manifests and indexes say.

One listing of the whole store (sizes and last-modified times included), then a GET of every manifest and of
every index a live image or a base image has. Nothing is decided here (:mod:`.gc` plans and deletes)::

    templates/<name>/<generation>/...   a template generation      (an image: live while its manifest.json exists)
    templates/<name>/latest             which generation is newest  (always kept)
    snapshots/<id>/...                  a snapshot                 (an image)
    hibernations/<sandbox id>/...       a stored hibernation       (an image)
    volumes/<volume id>/...             a volume's last stored image (an image; its index is image.idx)
    images/<kind>/<key>/<file>[.idx]    base images (kernel, initrd, rootfs: roots; a recipe's rootfs only while named)
    build-steps/<key>/...               recipe builds' step layers and their metas (read: :mod:`.buildsteps`)
    chunks/<sha[:2]>/<sha>              chunk objects
    leases/..., gc/...                  publishes and GCs in progress (:mod:`.leases`)
    owners/...                          registries and the images they claim (:mod:`.owners`)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ObjectNotFound, StoreError
from .buildsteps import StepEntry, group_steps, read_metas
from .chunkfmt import ChunkIndex, digest_of_key, index_format
from .client import ObjectMeta, ObjectStore
from .keys import BUILD_STEPS
from .leases import GC_PREFIX, LEASES_PREFIX
from .owners import OWNERS

IMAGE_ROOTS = {"templates": 3, "snapshots": 2, "hibernations": 2, "volumes": 2}  # top-level prefix -> segments
MANIFEST = "manifest.json"
INDEX = "memory.idx"
INDEXES = {"volumes": "image.idx"}  # an image root whose chunk index is not INDEX
LEGACY_PACK = "memory.pack"


@dataclass(frozen=True)
class IndexRefs:
    """What one chunk index names: ``format`` 2 and its digests; 1 (a legacy index: its ``.pack`` holds the
    chunks); 0 (none); or ``None`` (unreadable: it may name any chunk)."""

    format: int | None
    digests: frozenset[str] = frozenset()


NO_INDEX = IndexRefs(0)


@dataclass
class ImageGroup:
    """The objects under one image prefix, and (for a live one) its manifest and index."""

    prefix: str
    kind: str  # "templates" | "snapshots" | "hibernations" | "volumes"
    objects: list[ObjectMeta] = field(default_factory=list)
    manifest: dict[str, Any] | None = None  # parsed, for a live image
    has_manifest: bool = False
    index: IndexRefs = NO_INDEX

    @property
    def newest(self) -> float:
        """The last-modified time of its newest object."""
        return max((m.last_modified or 0.0) for m in self.objects) if self.objects else 0.0

    @property
    def size(self) -> int:
        return sum(m.size for m in self.objects)

    def referenced_template(self) -> str | None:
        """The template generation prefix a snapshot or hibernation sits on (its import rebases onto that disk)."""
        if self.manifest is None or self.kind == "templates":
            return None
        named = self.manifest.get("template_prefix")
        if isinstance(named, str) and named:
            return named.strip("/")
        name, generation = self.manifest.get("template"), self.manifest.get("template_generation")
        return f"templates/{name}/{generation}" if isinstance(name, str) and isinstance(generation, str) else None


@dataclass
class StoreView:
    listed: list[ObjectMeta] = field(default_factory=list)  # every object, as listed
    groups: dict[str, ImageGroup] = field(default_factory=dict)
    latest: dict[str, str] = field(default_factory=dict)  # template name -> generation ("*": unreadable pointer)
    chunks: dict[str, ObjectMeta] = field(default_factory=dict)  # sha256 -> its object
    base: list[ObjectMeta] = field(default_factory=list)  # images/... (legacy packs apart)
    base_indexes: dict[str, IndexRefs] = field(default_factory=dict)  # images/**.idx -> what it names
    legacy_packs: list[ObjectMeta] = field(default_factory=list)  # format-1 packs nothing reads any more
    leases: list[ObjectMeta] = field(default_factory=list)
    markers: list[ObjectMeta] = field(default_factory=list)
    owners: list[ObjectMeta] = field(default_factory=list)  # owners/: registries and their claims (:mod:`.owners`)
    steps: dict[str, StepEntry] = field(default_factory=dict)  # build-steps/ by step key, metas read
    step_problems: list[str] = field(default_factory=list)  # step metas that could not be read (they only stop
    # the step trim; reported)
    other: list[ObjectMeta] = field(default_factory=list)  # kept, unexamined (latest pointers, unknown keys)
    problems: list[str] = field(default_factory=list)
    """Why deleting chunks or template generations would be unsafe this run (something could not be read)."""


def scan(store: ObjectStore) -> StoreView:
    """List the store and read what the GC needs (latest pointers, manifests of images, indexes of live and base
    images)."""
    view = StoreView()
    steps: list[ObjectMeta] = []
    for meta in store.list_meta(""):
        view.listed.append(meta)
        if meta.key.startswith(f"{BUILD_STEPS}/"):
            steps.append(meta)
        else:
            _place(view, meta)
    view.steps = group_steps(steps)
    view.step_problems = read_metas(store, view.steps)
    _read_latest(store, view)
    for group in view.groups.values():
        if not group.has_manifest:
            continue
        group.manifest = _manifest(store, group, view)
        index = f"{group.prefix}/{INDEXES.get(group.kind, INDEX)}"
        if any(m.key == index for m in group.objects):
            group.index = _index(store, index, view)
        if group.index.format == 2:  # published again in the current format: the old pack is garbage
            pack = f"{group.prefix}/{LEGACY_PACK}"
            view.legacy_packs += [m for m in group.objects if m.key == pack]
            group.objects = [m for m in group.objects if m.key != pack]
    keys = {m.key for m in view.base}
    for meta in view.base:
        if meta.key.endswith(".idx"):
            view.base_indexes[meta.key] = _index(store, meta.key, view)
    for meta in list(view.base):
        idx = meta.key.removesuffix(".pack") + ".idx"
        if meta.key.endswith(".pack") and (idx not in keys or view.base_indexes[idx].format == 2):
            view.legacy_packs.append(meta)
            view.base.remove(meta)
    return view


def _place(view: StoreView, meta: ObjectMeta) -> None:
    parts = meta.key.split("/")
    top = parts[0]
    if top == "chunks":
        digest = digest_of_key(meta.key)
        if digest is not None:
            view.chunks[digest] = meta
            return
    elif top == LEASES_PREFIX:
        view.leases.append(meta)
        return
    elif top == GC_PREFIX:
        view.markers.append(meta)
        return
    elif top == OWNERS:
        view.owners.append(meta)
        return
    elif top == "images":
        view.base.append(meta)
        return
    elif top == "templates" and len(parts) == 3 and parts[2] == "latest":
        view.other.append(meta)
        return
    elif top in IMAGE_ROOTS and len(parts) > IMAGE_ROOTS[top]:
        prefix = "/".join(parts[: IMAGE_ROOTS[top]])
        group = view.groups.setdefault(prefix, ImageGroup(prefix, top))
        group.objects.append(meta)
        group.has_manifest = group.has_manifest or meta.key == f"{prefix}/{MANIFEST}"
        return
    view.other.append(meta)


def _read_latest(store: ObjectStore, view: StoreView) -> None:
    """Every ``templates/<name>/latest`` (an unreadable one keeps every generation of its template: ``"*"``)."""
    for meta in view.other:
        parts = meta.key.split("/")
        if len(parts) == 3 and parts[0] == "templates" and parts[2] == "latest":
            try:
                view.latest[parts[1]] = str(json.loads(store.get(meta.key))["generation"])
            except ObjectNotFound:
                continue
            except (StoreError, ValueError, KeyError, TypeError):
                view.latest[parts[1]] = "*"


def _manifest(store: ObjectStore, group: ImageGroup, view: StoreView) -> dict[str, Any]:
    """The parsed manifest of a live image; an unreadable one reads as ``{"unreadable": True}`` (kept)."""
    key = f"{group.prefix}/{MANIFEST}"
    try:
        found = json.loads(store.get(key))
    except ObjectNotFound:  # deleted since the listing: the image is going away; keep its objects this run
        return {"unreadable": True}
    except (StoreError, ValueError):
        view.problems.append(f"manifest {key} cannot be read")
        return {"unreadable": True}
    return found if isinstance(found, dict) else {"unreadable": True}


def _index(store: ObjectStore, key: str, view: StoreView) -> IndexRefs:
    try:
        blob = store.get(key)
    except ObjectNotFound:
        return NO_INDEX
    except StoreError as err:
        view.problems.append(f"index {key} cannot be read ({err.message})")
        return IndexRefs(None)
    version = index_format(blob)
    if version == 1:
        return IndexRefs(1)
    try:
        index = ChunkIndex.from_bytes(blob)
    except StoreError as err:
        view.problems.append(f"index {key} cannot be parsed ({err.message})")
        return IndexRefs(None)
    return IndexRefs(2, frozenset(index.digests()))
