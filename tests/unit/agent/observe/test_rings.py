"""Keyed rings: a ring never holds more than its count or weight, all of them never more than the total (the
heaviest ring pays), offsets stay valid as old items go, and forgotten keys free their weight."""

from __future__ import annotations

import pytest

from cryobox.agent.observe.rings import RingBounds, Rings


def contents(rings: Rings[str], key: str) -> list[tuple[int, str]]:
    ring = rings.get(key)
    assert ring is not None
    return list(ring.numbered())


def test_a_ring_keeps_its_newest_items_within_its_count_and_numbers_them() -> None:
    rings: Rings[str] = Rings(RingBounds(per_key_items=3, per_key_weight=100, total_weight=100))
    offsets = [rings.add("a", f"x{i}") for i in range(5)]
    assert offsets == [0, 1, 2, 3, 4]
    assert contents(rings, "a") == [(2, "x2"), (3, "x3"), (4, "x4")]
    ring = rings.get("a")
    assert ring is not None and ring.dropped == 2 and ring.end == 5


def test_a_ring_keeps_within_its_weight_but_always_its_newest_item() -> None:
    rings: Rings[str] = Rings(RingBounds(per_key_items=100, per_key_weight=10, total_weight=1000), weigh=len)
    for word in ("aaaa", "bbbb", "cccc"):
        rings.add("k", word)
    assert contents(rings, "k") == [(1, "bbbb"), (2, "cccc")]
    rings.add("k", "z" * 50)  # heavier than the ring may hold: kept alone
    assert contents(rings, "k") == [(3, "z" * 50)]
    assert rings.total_weight == 50


def test_past_the_total_the_heaviest_ring_loses_its_oldest() -> None:
    rings: Rings[str] = Rings(RingBounds(per_key_items=100, per_key_weight=100, total_weight=10), weigh=len)
    rings.add("quiet", "qq")
    for _ in range(6):
        rings.add("loud", "ll")
    assert rings.total_weight <= 10
    assert contents(rings, "quiet") == [(0, "qq")]  # the loud one paid for its own noise
    assert [o for o, _ in contents(rings, "loud")] == [2, 3, 4, 5]


def test_forget_and_keep_only_free_the_weight() -> None:
    rings: Rings[str] = Rings(RingBounds(per_key_items=10, per_key_weight=100, total_weight=100), weigh=len)
    for key in ("a", "b", "c"):
        rings.add(key, key * 3)
    assert rings.keep_only(["b"]) == ["a", "c"]
    assert rings.keys() == ["b"] and rings.total_weight == 3
    rings.forget("b")
    rings.forget("never")
    assert rings.keys() == [] and rings.total_weight == 0


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RingBounds(0, 1, 1)
