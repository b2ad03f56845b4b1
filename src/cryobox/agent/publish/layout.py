"""Where things live in the object store: the key prefixes of templates, snapshots and hibernations, and the
layout version a publish writes (the layout itself is described in :mod:`.templates`)."""

from __future__ import annotations

LAYOUT_VERSION = 2
"""Store layout of what a publish writes: 2 = content-addressed chunk objects (1: one memory.pack per image)."""


def template_prefix(name: str, generation: str) -> str:
    return f"templates/{name}/{generation}"


def snapshot_prefix(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}"


def hibernation_prefix(sandbox_id: str) -> str:
    return f"hibernations/{sandbox_id}"
