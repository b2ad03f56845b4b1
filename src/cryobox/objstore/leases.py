"""Publishes and store GCs announce themselves in the store, so a GC never deletes what a publish relies on.

Chunk objects are shared: a publish uploads only the chunks the store lacks, so it relies on chunks that other
images uploaded, and that a concurrent ``cryobox gc --store`` may find referenced by no live index (the image that
uploaded them was deleted). Two kinds of small objects close that race::

    leases/<token>.json   a publish in progress: {"prefixes": [...], "chunks": [sha256, ...], "started_at": t}
    gc/<token>.json       a store GC in progress: {"pid": ..., "host": ..., "started_at": t}

**Publisher** (:meth:`PublishLease.begin`): it indexes its images first (so it knows their chunks), puts its lease,
then lists ``gc/``; if any GC is running it waits ``SETTLE_S`` after its lease became durable. Only then does it
check for or upload chunks, or write anything under its prefixes. It re-puts the lease every ``REFRESH_S`` while
it works and leaves it behind when done: the GC deletes leases once they are older than its grace period.

**GC** (:mod:`.gc`): it puts its marker *before* its first listing of ``leases/``; it treats every chunk and
prefix a fresh lease (younger than the grace period) names as referenced; and it sends a delete only within
``GC_WINDOW_S`` of the start of its latest ``leases/`` listing (it lists again otherwise).

Why that suffices (both stores are read-after-write and list-after-write consistent): say the publisher relies
on object X (finds it present, or uploads it, or writes it) at time h, and its lease was durable at time i < h.

- it saw no marker: every GC marker was durable only after its ``gc/`` listing began (after i), so every ``leases/``
  listing of every GC running began after i and sees the lease: X is referenced throughout;
- it saw one: it waited, h >= i + SETTLE_S. A GC deleting X at time d > h listed ``leases/`` at r >= d - GC_WINDOW_S
  (plus the delete's own latency) > i + SETTLE_S - GC_WINDOW_S - latency >= i: it saw the lease.

A lease seen stays referenced for the rest of that GC run (the referenced set only grows), and a GC run stops
before half its grace period has passed, so a lease put after its first listing is still fresh when it lists
again. A lease that has gone stale belongs to a publish that finished (or died) long ago: the publish's manifest
and index, listed after the leases, reference what it relies on. Assumptions: a publish re-puts its lease more
often than the grace period; deletes take effect within ``SETTLE_S - GC_WINDOW_S`` (1.5 s) of being sent; the GC
host's clock and the store's agree to within a fraction of the grace period (ages come from last-modified times).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ObjectNotFound, StoreError
from .client import ObjectStore

LEASES_PREFIX = "leases"
GC_PREFIX = "gc"
SETTLE_S = 2.0
"""A publisher that sees a GC running waits this long after its lease is durable before it relies on anything."""
GC_WINDOW_S = 0.5
"""A GC sends a delete only this soon after starting the ``leases/`` listing it decided on."""
REFRESH_S = 120.0
"""A publisher re-puts its lease this often (a GC's grace period must be several times longer)."""


@dataclass(frozen=True)
class LeaseTiming:
    """The clock and sleep a lease uses (injected by tests), and its settle and refresh intervals."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    settle_s: float = SETTLE_S
    refresh_s: float = REFRESH_S


DEFAULT_TIMING = LeaseTiming()


class PublishLease:
    """A publish in progress, announced under ``leases/``: what it will write (prefixes) and rely on (chunks)."""

    def __init__(self, store: ObjectStore, key: str, body: bytes, timing: LeaseTiming) -> None:
        self.store = store
        self.key = key
        self._body = body
        self._timing = timing
        self._put_at = 0.0
        self.waited_s = 0.0
        """How long :meth:`begin` waited for a running GC to see the lease (0: none was running)."""

    @classmethod
    def begin(
        cls, store: ObjectStore, prefixes: Iterable[str], chunks: Iterable[str], timing: LeaseTiming = DEFAULT_TIMING
    ) -> PublishLease:
        """Put the lease, and return once relying on the store is safe (see the module doc)."""
        body = {"prefixes": sorted(set(prefixes)), "chunks": sorted(set(chunks)), "started_at": time.time()}
        lease = cls(store, f"{LEASES_PREFIX}/{secrets.token_hex(12)}.json", json.dumps(body).encode(), timing)
        lease._put()
        durable_at = lease._put_at
        if store.list(GC_PREFIX):
            wait = durable_at + timing.settle_s - timing.clock()
            if wait > 0:
                timing.sleep(wait)
                lease.waited_s = wait
        return lease

    def keep_alive(self) -> None:
        """Re-put the lease if ``refresh_s`` has passed since it was last put (call it while working)."""
        if self._timing.clock() - self._put_at >= self._timing.refresh_s:
            self._put()

    def _put(self) -> None:
        self.store.put(self.key, self._body)
        self._put_at = self._timing.clock()


@dataclass
class Leases:
    """What the fresh leases of a store name (a GC's view; it only grows during a run)."""

    chunks: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)  # lease keys read
    expired: dict[str, int] = field(default_factory=dict)  # stale lease key -> size
    unreadable: list[str] = field(default_factory=list)

    def names_prefix(self, prefix: str) -> bool:
        """Whether a fresh lease will write under ``prefix`` (or relies on the image there)."""
        return any(prefix == p or prefix.startswith(p + "/") or p.startswith(prefix + "/") for p in self.prefixes)


def read_leases(store: ObjectStore, now: float, grace_s: float, into: Leases | None = None) -> Leases:
    """List ``leases/`` and add what every fresh lease (last modified less than ``grace_s`` before ``now``, wall
    clock) names to ``into``; a lease that cannot be read counts as naming everything (see ``unreadable``)."""
    leases = into if into is not None else Leases()
    for meta in store.list_meta(LEASES_PREFIX):
        age = now - (meta.last_modified if meta.last_modified is not None else now)
        if age >= grace_s:
            leases.expired[meta.key] = meta.size
            continue
        leases.expired.pop(meta.key, None)  # re-put since an earlier listing
        if meta.key in leases.seen:
            continue
        try:
            body = json.loads(store.get(meta.key))
            chunks, prefixes = _strings(body, "chunks"), _strings(body, "prefixes")
        except ObjectNotFound:
            continue
        except (StoreError, ValueError):
            leases.unreadable.append(meta.key)
            continue
        leases.seen.add(meta.key)
        leases.chunks.update(chunks)
        leases.prefixes.update(prefixes)
    return leases


class GcMarker:
    """A store GC in progress, announced under ``gc/`` before it lists anything (see the module doc)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.key = f"{GC_PREFIX}/{secrets.token_hex(12)}.json"

    def __enter__(self) -> GcMarker:
        body = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
        self.store.put(self.key, json.dumps(body).encode())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.store.delete(self.key)
        except StoreError:  # a marker left behind only makes publishes wait SETTLE_S until the next GC removes it
            pass


def _strings(body: Any, name: str) -> list[str]:
    value = body.get(name) if isinstance(body, dict) else None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"lease field {name!r} must be a list of strings")
    return value
