"""Which template generations a store GC deletes: out of the newest ``keep`` of their template for the grace
period, not ``latest``, not under a fresh lease, and not what a staying snapshot or hibernation sits on."""

from __future__ import annotations

from .gcscan import MANIFEST, ImageGroup, StoreView
from .leases import Leases


def dead_generations(
    view: StoreView, live: dict[str, ImageGroup], leases: Leases, old: float, keep: int
) -> list[ImageGroup]:
    needed = {g.referenced_template() for g in live.values()}
    by_name: dict[str, list[ImageGroup]] = {}
    for group in live.values():
        if group.kind == "templates":
            by_name.setdefault(group.prefix.split("/")[1], []).append(group)
    dead = []
    for name, generations in by_name.items():
        if view.latest.get(name) == "*":
            continue
        generations.sort(key=published_at, reverse=True)
        for position, group in enumerate(generations):
            if position < keep or group.prefix.split("/")[2] == view.latest.get(name):
                continue
            if group.prefix in needed or leases.names_prefix(group.prefix) or "unreadable" in (group.manifest or {}):
                continue
            if published_at(generations[position - keep]) > old:  # left the newest `keep` less than grace ago
                continue
            dead.append(group)
    return dead


def published_at(group: ImageGroup) -> float:
    value = (group.manifest or {}).get("published_at")
    manifest = next((m for m in group.objects if m.key.endswith(f"/{MANIFEST}")), None)
    fallback = manifest.last_modified if manifest is not None and manifest.last_modified else 0.0
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else fallback
