"""What a store GC run removed (or, dry, would remove) and kept: :class:`GcReport`, by :data:`KINDS`."""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("generation", "disowned", "stray", "legacy", "image", "chunk", "claim", "lease", "marker", "step")
"""``disowned``: objects of a stored snapshot or hibernation whose registry no longer holds it
(:mod:`.owners`); ``claim``: the ``owners/`` objects that went with it (or of images already gone)."""


@dataclass(frozen=True)
class Removal:
    key: str
    size: int
    kind: str  # one of KINDS
    group: str | None = None  # the image prefix, for generation and stray removals


@dataclass
class GcReport:
    """What a run removed (or, with ``dry_run``, would remove) and kept."""

    store: str
    dry_run: bool
    removed: list[Removal] = field(default_factory=list)
    kept_objects: int = 0
    kept_bytes: int = 0
    chunks_referenced: int = 0
    chunks_missing: list[str] = field(default_factory=list)  # named by a live index but absent (reported)
    skipped: list[str] = field(default_factory=list)  # what was kept because a lease appeared, and why
    notes: list[str] = field(default_factory=list)
    complete: bool = True

    @property
    def removed_objects(self) -> int:
        return len(self.removed)

    @property
    def removed_bytes(self) -> int:
        return sum(r.size for r in self.removed)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (objects, bytes) removed."""
        found = {kind: (0, 0) for kind in KINDS}
        for r in self.removed:
            n, b = found[r.kind]
            found[r.kind] = (n + 1, b + r.size)
        return found

    def to_json(self) -> dict[str, object]:
        return {
            "store": self.store,
            "dry_run": self.dry_run,
            "complete": self.complete,
            "removed": {"objects": self.removed_objects, "bytes": self.removed_bytes},
            "kept": {"objects": self.kept_objects, "bytes": self.kept_bytes},
            "by_kind": {k: {"objects": n, "bytes": b} for k, (n, b) in self.by_kind().items()},
            "chunks_referenced": self.chunks_referenced,
            "chunks_missing": self.chunks_missing,
            "skipped": self.skipped,
            "notes": self.notes,
            "keys": [r.key for r in self.removed],
        }
