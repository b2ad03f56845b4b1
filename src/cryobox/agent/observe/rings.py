"""Keyed rings with bounds on each ring and on all of them together: what a host keeps per sandbox (samples, log
lines) never grows past a count and a weight per sandbox, nor past a total weight for the host.

Adding to a ring past its own bounds drops that ring's oldest items; adding past the total drops the oldest item
of the heaviest ring (so a sandbox that writes much loses its own history first, never a quiet one's). Each ring
counts what it dropped, and numbers what it holds: the n-th item ever added to a key is at offset n - 1, so a
reader pages with offsets that stay valid while older items are dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RingBounds:
    per_key_items: int
    per_key_weight: int
    total_weight: int

    def __post_init__(self) -> None:
        if min(self.per_key_items, self.per_key_weight, self.total_weight) < 1:
            raise ValueError(f"ring bounds must be positive: {self}")


@dataclass
class Ring(Generic[T]):
    """One key's items, oldest first; ``first`` is the offset of ``items[0]``."""

    items: deque[T] = field(default_factory=deque)
    weights: deque[int] = field(default_factory=deque)
    first: int = 0
    weight: int = 0

    @property
    def end(self) -> int:
        """The offset the next item gets (every item ever added, dropped ones included)."""
        return self.first + len(self.items)

    @property
    def dropped(self) -> int:
        return self.first

    def drop_oldest(self) -> None:
        self.items.popleft()
        self.weight -= self.weights.popleft()
        self.first += 1

    def numbered(self) -> Iterator[tuple[int, T]]:
        """``(offset, item)``, oldest first."""
        return zip(range(self.first, self.end), self.items, strict=True)


class Rings(Generic[T]):
    def __init__(self, bounds: RingBounds, weigh: Callable[[T], int] = lambda _: 1) -> None:
        self.bounds = bounds
        self.weigh = weigh
        self._rings: dict[str, Ring[T]] = {}
        self.total_weight = 0

    def add(self, key: str, item: T) -> int:
        """Keep ``item`` as ``key``'s newest; returns its offset. An item heavier than a ring may hold is kept
        alone (the caller bounds single items)."""
        ring = self._rings.setdefault(key, Ring())
        weight = max(0, self.weigh(item))
        ring.items.append(item)
        ring.weights.append(weight)
        ring.weight += weight
        self.total_weight += weight
        while len(ring.items) > 1 and (
            len(ring.items) > self.bounds.per_key_items or ring.weight > self.bounds.per_key_weight
        ):
            self._drop(ring)
        while self.total_weight > self.bounds.total_weight:
            others = [r for r in self._rings.values() if r.items and (r is not ring or len(r.items) > 1)]
            if not others:
                break
            self._drop(max(others, key=lambda r: r.weight))
        return ring.end - 1

    def _drop(self, ring: Ring[T]) -> None:
        before = ring.weight
        ring.drop_oldest()
        self.total_weight -= before - ring.weight

    def get(self, key: str) -> Ring[T] | None:
        return self._rings.get(key)

    def keys(self) -> list[str]:
        return list(self._rings)

    def forget(self, key: str) -> None:
        ring = self._rings.pop(key, None)
        if ring is not None:
            self.total_weight -= ring.weight

    def keep_only(self, keys: Iterable[str]) -> list[str]:
        """Forget every key not in ``keys``; returns the keys forgotten."""
        wanted = set(keys)
        gone = [k for k in self._rings if k not in wanted]
        for key in gone:
            self.forget(key)
        return gone
