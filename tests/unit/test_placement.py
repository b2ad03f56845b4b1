"""Placement with in-flight reservations: a burst decided before any work lands must spread, not pile up."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from cryobox.errors import HostUnavailable, InvalidArgument, StateError
from cryobox.server.placement import HostCapacity, Placement, Reservation


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeHost:
    """A host's own count of started work; the test decides when work 'lands'."""

    def __init__(self, name: str, slots_total: int, used: int = 0) -> None:
        self.name = name
        self.slots_total = slots_total
        self.used = used

    def __call__(self) -> int:
        return self.used

    def capacity(self) -> HostCapacity:
        return HostCapacity(self.name, self.slots_total, self)


def fleet(*specs: tuple[str, int, int]) -> dict[str, FakeHost]:
    return {name: FakeHost(name, total, used) for name, total, used in specs}


def placement(
    hosts: dict[str, FakeHost],
    clock: FakeClock | None = None,
    *,
    count_reservations: bool = True,
    reservation_ttl_s: float = 60.0,
    retry_after_s: float = 1.0,
) -> Placement:
    return Placement(
        [h.capacity() for h in hosts.values()],
        clock or FakeClock(),
        count_reservations=count_reservations,
        reservation_ttl_s=reservation_ttl_s,
        retry_after_s=retry_after_s,
    )


def state_of(r: Reservation) -> str:
    """``r.state`` without mypy narrowing it across calls that change it."""
    return r.state


def burst(p: Placement, n: int) -> list[Reservation]:
    return [p.reserve() for _ in range(n)]


FOUR_EQUAL = (("a", 16, 0), ("b", 16, 0), ("c", 16, 0), ("d", 16, 0))
# One host looks emptiest: the classic herd magnet.
ONE_EMPTIEST = (("a", 16, 2), ("b", 16, 4), ("c", 16, 4), ("d", 16, 4))


# -- the herd -------------------------------------------------------------------------------------------------


def test_burst_spreads_evenly_over_four_hosts() -> None:
    p = placement(fleet(*FOUR_EQUAL))
    reservations = burst(p, 32)  # decided before any work lands: every used_fn still says 0
    assert Counter(r.host for r in reservations) == {"a": 8, "b": 8, "c": 8, "d": 8}
    assert {h: s["reserved"] for h, s in p.snapshot().items()} == {"a": 8, "b": 8, "c": 8, "d": 8}


def test_naive_placement_sends_the_whole_burst_to_one_host() -> None:
    # Same fleet, same burst, but only the hosts' own counts: nothing has landed yet, so "a" always looks best.
    naive = placement(fleet(*FOUR_EQUAL), count_reservations=False)
    assert Counter(r.host for r in burst(naive, 32)) == {"a": 32}  # twice a's 16 slots


def test_burst_levels_hosts_instead_of_piling_onto_the_emptiest() -> None:
    naive = placement(fleet(*ONE_EMPTIEST), count_reservations=False)
    assert Counter(r.host for r in burst(naive, 32)) == {"a": 32}

    p = placement(fleet(*ONE_EMPTIEST))
    assert Counter(r.host for r in burst(p, 32)) == {"a": 10, "b": 8, "c": 7, "d": 7}
    free = [s["free"] for s in p.snapshot().values()]
    assert max(free) - min(free) <= 1  # water-filled: the emptiest host absorbed only its head start


def test_ties_go_to_the_first_host_by_name() -> None:
    hosts = fleet(("c", 4, 0), ("a", 4, 0), ("b", 4, 0))
    p = placement(hosts)
    assert p.hosts == ("a", "b", "c")
    assert [r.host for r in burst(p, 6)] == ["a", "b", "c", "a", "b", "c"]


# -- commit / release -----------------------------------------------------------------------------------------


def test_commit_hands_the_slot_to_the_hosts_own_count() -> None:
    hosts = fleet(("a", 4, 0))
    p = placement(hosts)
    r = p.reserve()
    assert p.snapshot()["a"] == {"total": 4, "used": 0, "reserved": 1, "free": 3}
    hosts["a"].used += 1  # the work started: the host counts it ...
    r.commit()  # ... and the reservation stops counting, so it is not counted twice
    assert r.state == "committed"
    assert p.snapshot()["a"] == {"total": 4, "used": 1, "reserved": 0, "free": 3}
    r.commit()
    r.release()  # both no-ops after commit
    assert r.state == "committed"
    assert p.snapshot()["a"]["free"] == 3


def test_release_returns_capacity_and_is_idempotent() -> None:
    p = placement(fleet(("a", 2, 0)))
    r1, r2 = burst(p, 2)
    with pytest.raises(HostUnavailable):
        p.reserve()
    r1.release()
    r1.release()
    assert r1.state == "released"
    assert p.snapshot()["a"] == {"total": 2, "used": 0, "reserved": 1, "free": 1}
    assert p.reserve().host == "a"
    with pytest.raises(StateError):
        r1.commit()  # work cannot start on slots given back


def test_context_manager_releases_unless_committed() -> None:
    hosts = fleet(("a", 2, 0))
    p = placement(hosts)
    with pytest.raises(RuntimeError), p.reserve() as r:
        raise RuntimeError("VM failed to start")
    assert r.state == "released"
    assert p.snapshot()["a"]["reserved"] == 0

    with p.reserve() as r:
        hosts["a"].used += 1
        r.commit()
    assert r.state == "committed"
    assert p.snapshot()["a"] == {"total": 2, "used": 1, "reserved": 0, "free": 1}


# -- refusal --------------------------------------------------------------------------------------------------


def test_full_is_a_503_with_retry_after() -> None:
    p = placement(fleet(("a", 2, 1), ("b", 2, 0)), retry_after_s=3.0)
    burst(p, 3)
    with pytest.raises(HostUnavailable) as info:
        p.reserve()
    err = info.value
    assert err.http_status == 503 and err.code == "capacity"
    assert err.retry_after_s == 3.0
    assert err.details == {"cost": 1, "free": {"a": 0, "b": 0}}


def test_cost_must_fit_on_one_host() -> None:
    p = placement(fleet(("a", 4, 1), ("b", 4, 2)))
    assert p.reserve(cost=3).host == "a"  # a: 3 free, b: 2 free
    assert p.reserve(cost=2).host == "b"  # a: 0 free now
    with pytest.raises(HostUnavailable):
        p.reserve(cost=1)  # 0 + 0 free
    with pytest.raises(HostUnavailable):
        placement(fleet(("a", 4, 0), ("b", 4, 0))).reserve(cost=5)  # 8 free in total, but not on one host
    for bad in (0, -1, True):
        with pytest.raises(InvalidArgument):
            p.reserve(cost=bad)


def test_overcommitted_host_is_never_chosen_and_reports_zero_free() -> None:
    p = placement(fleet(("a", 2, 5), ("b", 2, 0)))
    assert p.snapshot()["a"] == {"total": 2, "used": 5, "reserved": 0, "free": 0}
    assert [r.host for r in burst(p, 2)] == ["b", "b"]


# -- expiry ---------------------------------------------------------------------------------------------------


def test_uncommitted_reservation_expires_and_frees_capacity() -> None:
    clock = FakeClock()
    p = placement(fleet(("a", 1, 0)), clock, reservation_ttl_s=10.0)
    r = p.reserve()
    assert r.expires_at == clock.now + 10.0
    clock.now += 9.9
    with pytest.raises(HostUnavailable):
        p.reserve()
    clock.now += 0.1
    assert p.snapshot()["a"]["reserved"] == 0
    assert r.state == "expired"
    r.release()  # no-op: already gone
    assert r.state == "expired"
    r2 = p.reserve()
    assert r2.host == "a"
    r.commit()  # late commit of an expired reservation is accepted but must not free r2's slot
    assert state_of(r) == "committed"
    assert p.snapshot()["a"]["reserved"] == 1


# -- construction ---------------------------------------------------------------------------------------------


def test_single_host_default() -> None:
    used = [3]
    p = Placement.single("local", 4, lambda: used[0], FakeClock())
    assert p.hosts == ("local",)
    r = p.reserve()
    assert r.host == "local"
    with pytest.raises(HostUnavailable):
        p.reserve()
    assert p.snapshot() == {"local": {"total": 4, "used": 3, "reserved": 1, "free": 0}}


@pytest.mark.parametrize(
    ("hosts", "ttl_s", "retry_after_s"),
    [
        ([], 60.0, 1.0),
        ([("a", 1, 0), ("a", 2, 0)], 60.0, 1.0),
        ([("a", 1, 0)], 0.0, 1.0),
        ([("a", 1, 0)], 60.0, float("nan")),
    ],
)
def test_invalid_placement(hosts: list[tuple[str, int, int]], ttl_s: float, retry_after_s: float) -> None:
    with pytest.raises(InvalidArgument):
        Placement(
            [HostCapacity(name, total, lambda: 0) for name, total, _ in hosts],
            FakeClock(),
            reservation_ttl_s=ttl_s,
            retry_after_s=retry_after_s,
        )


@pytest.mark.parametrize(("name", "slots"), [("", 1), ("a", -1), ("a", True)])
def test_invalid_host(name: str, slots: int) -> None:
    with pytest.raises(InvalidArgument):
        HostCapacity(name, slots, lambda: 0)


# -- threads --------------------------------------------------------------------------------------------------


def test_concurrent_reservations_never_overbook() -> None:
    p = placement(fleet(("a", 4, 0), ("b", 4, 0), ("c", 4, 0), ("d", 4, 0)))
    start = threading.Barrier(32)
    won: list[str] = []
    refused: list[HostUnavailable] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait()
        try:
            r = p.reserve()
        except HostUnavailable as err:
            with lock:
                refused.append(err)
        else:
            with lock:
                won.append(r.host)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert Counter(won) == {"a": 4, "b": 4, "c": 4, "d": 4}
    assert len(refused) == 16
