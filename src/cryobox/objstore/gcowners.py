"""What a store GC plans for the images registries let go (:mod:`.owners`): which live images go, and which
claims and ``latest`` pointers follow once nothing under their prefix is left (pure functions of a scan)."""

from __future__ import annotations

from .client import ObjectMeta
from .gcscan import ImageGroup, StoreView
from .leases import Leases
from .owners import Judgement, template_of


def let_go(prefix: str, owners: Judgement) -> bool:
    """Whether the image at ``prefix`` (a template's generation: by its template) was let go by its registries."""
    return prefix in owners.disowned or template_of(prefix) in owners.disowned


def disowned_groups(live: dict[str, ImageGroup], owners: Judgement, leases: Leases) -> list[ImageGroup]:
    """Live images let go, except a template generation a staying image sits on (a snapshot another registry
    still lists restores onto it) and what a fresh lease names."""
    needed = {g.referenced_template() for p, g in live.items() if not let_go(p, owners)}
    return [g for p, g in live.items() if let_go(p, owners) and p not in needed and not leases.names_prefix(p)]


def owned_objects(view: StoreView, owners: Judgement) -> dict[str, list[ObjectMeta]]:
    """Claimed prefix let go -> its claims, and for a template its ``latest`` pointer: deleted after the images."""
    owned = {prefix: list(owners.claims.get(prefix, [])) for prefix in owners.disowned}
    for meta in view.other:
        parts = meta.key.split("/")
        if len(parts) == 3 and parts[0] == "templates" and parts[2] == "latest" and template_of(meta.key) in owned:
            owned[template_of(meta.key)].insert(0, meta)
    return owned


def holds(prefixes: set[str], prefix: str) -> bool:
    """Whether any image in ``prefixes`` is ``prefix`` or lies under it."""
    return prefix in prefixes or any(p.startswith(f"{prefix}/") for p in prefixes)
