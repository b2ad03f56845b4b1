"""Placement with in-flight reservations: a burst decided before any work lands must spread, not pile up.

The policy (:func:`choose`) is tested on hand-made loads; :class:`Placement` over a real (SQLite) registry whose
agents registered with heartbeats, with an injected clock for liveness and reservation expiry.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from cryobox.errors import HostUnavailable, StateError
from cryobox.registry import AgentLoad, AgentRow, Registry, ReservationRow, SandboxRow
from cryobox.registry.strays import unknown_sandboxes
from cryobox.server.control.placement import (
    IN_FLIGHT_PENALTY_MIB,
    LOCALITY_BONUS_MIB,
    Placement,
    PlacementRequest,
    choose,
    require_servable,
)
from tests.support import registry as registry_support
from tests.support.clock import T0, FakeClock

MIB = 512  # one sandbox of the "base" template
DEADLINE_S = 10.0
BASE = PlacementRequest(memory_mib=MIB, cpus=1, template="base")


def capacity(
    total_mib: int = 16 * MIB,
    max_sandboxes: int = 16,
    templates: dict[str, str] | None = None,
    hot: list[str] | None = None,
    local: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "memory_total_mib": total_mib,
        "max_sandboxes": max_sandboxes,
        "templates_ready": {"base": "g1"} if templates is None else templates,
        "hot_images": list(hot or []),
        "local_snapshots": list(local or []),
    }


def load(
    name: str,
    *,
    committed: int = 0,
    reservations: int = 0,
    status: str = "up",
    reserved_mib: int | None = None,
    committed_mib: int | None = None,
    total_mib: int = 16 * MIB,
    max_sandboxes: int = 16,
    templates: dict[str, str] | None = None,
    hot: list[str] | None = None,
    local: list[str] | None = None,
) -> AgentLoad:
    """An agent's load: ``committed`` sandboxes and ``reservations`` in flight, ``MIB`` each unless told."""
    row = AgentRow(
        name=name,
        url="",
        boot_id="boot-1",
        status=status,
        heartbeat_at=T0,
        registered_at=T0,
        capacity=capacity(total_mib, max_sandboxes, templates, hot, local),
    )
    return AgentLoad(
        agent=row,
        committed_memory_mib=committed * MIB if committed_mib is None else committed_mib,
        committed_cpus=committed,
        sandboxes=committed,
        reserved_memory_mib=reservations * MIB if reserved_mib is None else reserved_mib,
        reserved_cpus=reservations,
        reservations=reservations,
    )


def reserved(item: AgentLoad, memory_mib: int = MIB) -> AgentLoad:
    """``item`` after one more reservation on it (what the registry would count next time)."""
    return replace(
        item,
        reserved_memory_mib=item.reserved_memory_mib + memory_mib,
        reserved_cpus=item.reserved_cpus + 1,
        reservations=item.reservations + 1,
    )


def burst(
    request: PlacementRequest,
    loads: list[AgentLoad],
    n: int,
    policy: Callable[[PlacementRequest, list[AgentLoad]], str | None] = choose,
) -> list[str]:
    """``n`` decisions in a row, each recording a reservation the next ones may see (nothing is committed)."""
    by_name = {item.agent.name: item for item in loads}
    picks: list[str] = []
    for _ in range(n):
        name = policy(request, list(by_name.values()))
        assert name is not None
        by_name[name] = reserved(by_name[name], request.memory_mib)
        picks.append(name)
    return picks


def naive(request: PlacementRequest, loads: list[AgentLoad]) -> str | None:
    """The policy reservations replace: only the committed load (the agents' own numbers) counts."""
    return choose(request, [replace(x, reserved_memory_mib=0, reserved_cpus=0, reservations=0) for x in loads])


FOUR = ("a", "b", "c", "d")


# -- choose: the burst -------------------------------------------------------------------------------------------


def test_a_burst_spreads_because_each_reservation_lowers_the_score() -> None:
    picks = burst(BASE, [load(n) for n in FOUR], 32)
    assert Counter(picks) == {"a": 8, "b": 8, "c": 8, "d": 8}
    assert picks[:8] == ["a", "b", "c", "d", "a", "b", "c", "d"]  # ties go to the first name, round after round


def test_the_naive_policy_sends_the_whole_burst_to_one_agent() -> None:
    # nothing lands in the committed load during the burst: "a" always looks best, even past its 16 slots
    assert Counter(burst(BASE, [load(n) for n in FOUR], 32, naive)) == {"a": 32}


def test_a_burst_levels_agents_instead_of_piling_onto_the_emptiest() -> None:
    loads = [load("a", committed=2), load("b", committed=4), load("c", committed=4), load("d", committed=4)]
    assert Counter(burst(BASE, loads, 32, naive)) == {"a": 32}  # the herd magnet
    # with reservations the emptiest gets only its head start (a, a, then b, c, d), then the four take turns
    picks = Counter(burst(BASE, loads, 32))
    assert picks == {"a": 9, "b": 8, "c": 8, "d": 7}
    totals = [picks[x.agent.name] + x.sandboxes for x in loads]
    assert max(totals) - min(totals) <= 1  # water-filled


def test_the_in_flight_penalty_counts_beyond_the_reserved_memory() -> None:
    # b has 400 MiB more free memory, but one reservation in flight: 512 MiB of penalty outweigh that
    a = load("a", committed_mib=1000)
    b = load("b", reservations=1, reserved_mib=600)
    assert IN_FLIGHT_PENALTY_MIB > 400
    assert choose(BASE, [a, b]) == "a"
    assert choose(BASE, [a, replace(b, reservations=0)]) == "b"  # the same memory without the reservation


# -- choose: what is never chosen --------------------------------------------------------------------------------


def test_an_agent_without_a_free_slot_is_never_chosen() -> None:
    big = 1 << 20  # far more free memory than the other: it would win on score
    full = load("a", committed=2, max_sandboxes=2, total_mib=big)
    assert choose(BASE, [full, load("b")]) == "b"
    by_reservation = load(
        "a", committed=1, reservations=1, max_sandboxes=2, total_mib=big
    )  # a slot reserved counts too
    assert choose(BASE, [by_reservation, load("b")]) == "b"
    overcommitted = load("a", committed=5, max_sandboxes=2, total_mib=big)
    assert choose(BASE, [overcommitted, load("b")]) == "b"
    assert choose(BASE, [full]) is None
    assert (
        choose(BASE, [load("a", committed=1, max_sandboxes=2, total_mib=big), load("b")]) == "a"
    )  # the last slot is free


def test_an_agent_without_the_memory_is_never_chosen_even_with_the_locality_bonus() -> None:
    # a has 256 MiB free (+1024 bonus as the preferred agent) and outscores b's 1000, but 512 do not fit there
    a = load("a", total_mib=1024, reservations=1, reserved_mib=768)
    b = load("b", total_mib=1000)
    prefer_a = replace(BASE, prefer="a")
    assert choose(prefer_a, [a, b]) == "b"
    assert choose(prefer_a, [a]) is None
    assert choose(BASE, [load("a", total_mib=MIB)]) == "a"  # exactly fits
    assert choose(BASE, [load("a", total_mib=MIB - 1)]) is None
    assert choose(BASE, [load("a", total_mib=4 * MIB, committed=3, max_sandboxes=100)]) == "a"
    assert choose(BASE, [load("a", total_mib=4 * MIB, committed=4, max_sandboxes=100)]) is None


def test_warm_pool_memory_counts_as_used() -> None:
    """Pooled QEMUs map their template's memory: an agent whose pools hold most of it is not chosen."""
    roomy = load("a", total_mib=4 * MIB)
    pooled = replace(roomy, agent=replace(roomy.agent, capacity={**roomy.agent.capacity, "memory_pooled_mib": 3 * MIB}))
    assert choose(BASE, [pooled]) == "a"  # one more still fits exactly
    full = replace(
        pooled, agent=replace(pooled.agent, capacity={**pooled.agent.capacity, "memory_pooled_mib": 3 * MIB + 1})
    )
    assert choose(BASE, [full]) is None
    assert choose(BASE, [full, load("b", total_mib=2 * MIB)]) == "b"


def test_only_agents_serving_the_template_and_generation() -> None:
    a = load("a", total_mib=1 << 20)  # the best score, serving base g1
    b = load("b", templates={"base": "g2"})
    c = load("c", templates={"other": "g1"})
    assert choose(BASE, [a, b, c]) == "a"
    assert choose(replace(BASE, generation="g2"), [a, b, c]) == "b"
    assert choose(replace(BASE, generation="g3"), [a, b, c]) is None
    assert choose(replace(BASE, template="other"), [a, b, c]) == "c"
    assert choose(replace(BASE, template="gpu"), [a, b, c]) is None
    assert choose(BASE, [load("x", templates={})]) is None


def test_a_generation_no_registered_agent_serves_is_a_conflict_not_capacity() -> None:
    a = load("a", status="down", templates={"base": "g1"}).agent
    b = load("b", templates={"base": "g2"}).agent
    require_servable(BASE, [a, b])  # a template create names no generation
    require_servable(replace(BASE, generation="g1"), [a, b])  # a is down: it may come back, so 503 later
    require_servable(replace(BASE, generation="g2", only="b"), [a, b])
    for refused in (replace(BASE, generation="g0"), replace(BASE, generation="g1", only="b")):
        with pytest.raises(StateError) as error:
            require_servable(refused, [a, b])
        assert error.value.http_status == 409 and error.value.details["generation"] == refused.generation
    with pytest.raises(StateError):
        require_servable(replace(BASE, generation="g1"), [])


def test_only_restricts_to_one_agent() -> None:
    a = load("a", total_mib=1 << 20)
    b = load("b")
    assert choose(replace(BASE, only="b"), [a, b]) == "b"
    assert choose(replace(BASE, only="nobody"), [a, b]) is None
    full_b = load("b", committed=16)
    assert choose(replace(BASE, only="b"), [a, full_b]) is None  # never falls back to another agent
    assert choose(replace(BASE, only="b", generation="g2"), [a, b]) is None


def test_agents_not_up_are_skipped() -> None:
    for status in ("down", "draining"):
        assert choose(BASE, [load("a", status=status, total_mib=1 << 20), load("b")]) == "b"
        assert choose(BASE, [load("a", status=status, total_mib=1 << 20)]) is None


def test_ties_go_to_the_first_name_whatever_the_order_of_the_loads() -> None:
    assert choose(BASE, [load("c"), load("a"), load("b")]) == "a"
    assert choose(BASE, [load("c"), load("b")]) == "b"
    assert choose(BASE, []) is None


# -- choose: locality --------------------------------------------------------------------------------------------


def test_prefer_gives_the_locality_bonus() -> None:
    a = load("a")
    b = load("b", committed=1)  # 512 MiB less free than a: less than the bonus
    assert choose(BASE, [a, b]) == "a"
    assert choose(replace(BASE, prefer="b"), [a, b]) == "b"
    far = load("b", committed=3)  # 1536 MiB less than a: more than the default bonus ...
    assert 3 * MIB > LOCALITY_BONUS_MIB
    assert choose(replace(BASE, prefer="b"), [a, far]) == "a"
    assert choose(replace(BASE, prefer="b", locality_bonus_mib=4096), [a, far]) == "b"  # ... not a bigger one


@pytest.mark.parametrize("field", ["hot", "local"])
def test_local_keys_give_the_bonus_to_the_agent_holding_them(field: str) -> None:
    key = "tpl-base-g1" if field == "hot" else "snap-1"
    a = load("a")
    held = [key, "something-else"]
    b = load("b", committed=1, hot=held) if field == "hot" else load("b", committed=1, local=held)
    assert choose(BASE, [a, b]) == "a"  # no keys asked: no bonus
    assert choose(replace(BASE, local_keys=frozenset({key})), [a, b]) == "b"
    assert choose(replace(BASE, local_keys=frozenset({"snap-elsewhere"})), [a, b]) == "a"


def test_the_bonus_does_not_make_a_full_agent_eligible() -> None:
    b = load("b", committed=16, hot=["tpl-base-g1"])
    assert choose(replace(BASE, local_keys=frozenset({"tpl-base-g1"}), prefer="b"), [load("a"), b]) == "a"


# -- Placement over the registry ---------------------------------------------------------------------------------


# the shared fixtures (registry_support), bound here under the names the tests ask for
registry = registry_support.sqlite_registry
clock = registry_support.clock


def register(registry: Registry, name: str, now: float, *, total_mib: int = 16 * MIB, max_sandboxes: int = 16) -> None:
    """The registry side of an agent's heartbeat (as ``Fleet.heartbeat`` records it)."""
    registry.fleet.heartbeat(
        name,
        url=f"http://{name}.invalid:7070",
        boot_id="boot-1",
        capacity=capacity(total_mib, max_sandboxes),
        info={},
        now=now,
    )


def placement(registry: Registry, clock: FakeClock, *, ttl_s: float = 60.0) -> Placement:
    return Placement(registry, deadline_s=DEADLINE_S, ttl_s=ttl_s, clock=clock)


def sandbox_row(sandbox_id: str, workspace_id: str, host: str) -> SandboxRow:
    return SandboxRow(
        id=sandbox_id, workspace_id=workspace_id, template="base", cpus=1, memory_mib=MIB, status="running", host=host
    )


def per_agent(reservations: list[ReservationRow]) -> Counter[str]:
    return Counter(r.agent for r in reservations)


async def test_32_reservations_before_any_commit_spread_8_8_8_8(registry: Registry, clock: FakeClock) -> None:
    for name in FOUR:
        register(registry, name, T0)
    # the naive policy on the same registry: every decision sees the same committed load, so all go to "a"
    piled = [
        registry.fleet.reserve(
            memory_mib=MIB,
            cpus=1,
            now=T0,
            ttl_s=60.0,
            choose=lambda loads: naive(BASE, loads),
            live_after=T0 - DEADLINE_S,
        )
        for _ in range(32)
    ]
    assert per_agent(piled) == {"a": 32}  # twice a's 16 slots
    for r in piled:
        registry.fleet.release(r.id)
    assert registry.fleet.reservations() == []

    p = placement(registry, clock)
    decided = [await p.reserve(BASE, f"sb-{i}") for i in range(32)]
    assert per_agent(decided) == {"a": 8, "b": 8, "c": 8, "d": 8}
    assert per_agent(registry.fleet.reservations()) == {"a": 8, "b": 8, "c": 8, "d": 8}
    assert [r.sandbox_id for r in decided] == [f"sb-{i}" for i in range(32)]
    assert all(r.memory_mib == MIB and r.cpus == 1 and r.expires_at == T0 + 60.0 for r in decided)


async def test_concurrent_reservations_never_overbook(registry: Registry, clock: FakeClock) -> None:
    for name in FOUR:
        register(registry, name, T0, max_sandboxes=4)
    p = placement(registry, clock)
    results = await asyncio.gather(*(p.reserve(BASE) for _ in range(24)), return_exceptions=True)
    won = [r for r in results if isinstance(r, ReservationRow)]
    refused = [r for r in results if isinstance(r, HostUnavailable)]
    assert per_agent(won) == {"a": 4, "b": 4, "c": 4, "d": 4}
    assert len(refused) == 8 and len(won) + len(refused) == len(results)
    assert per_agent(registry.fleet.reservations()) == {"a": 4, "b": 4, "c": 4, "d": 4}


async def test_release_gives_the_capacity_back(registry: Registry, clock: FakeClock) -> None:
    register(registry, "a", T0, max_sandboxes=2)
    p = placement(registry, clock)
    r1 = await p.reserve(BASE)
    await p.reserve(BASE)
    with pytest.raises(HostUnavailable):
        await p.reserve(BASE)
    await p.release(r1)
    await p.release(r1)  # idempotent
    assert len(registry.fleet.reservations("a")) == 1
    assert (await p.reserve(BASE)).agent == "a"
    with pytest.raises(HostUnavailable):
        await p.reserve(BASE)


async def test_reservations_expire_after_their_ttl(registry: Registry, clock: FakeClock) -> None:
    register(registry, "a", T0, max_sandboxes=1)
    p = Placement(registry, deadline_s=1e9, ttl_s=10.0, clock=clock)  # the agent stays live: only the ttl counts
    r1 = await p.reserve(BASE, "sb-1")
    assert r1.expires_at == T0 + 10.0
    clock.now = T0 + 9.9
    with pytest.raises(HostUnavailable):
        await p.reserve(BASE)
    clock.now = T0 + 10.0
    r2 = await p.reserve(BASE, "sb-2")  # r1's room came back by itself
    assert r2.agent == "a"
    assert [r.id for r in registry.fleet.reservations()] == [r2.id]  # the expired one was deleted
    # a late commit of the expired reservation still inserts its row, and must not take r2 away
    ws = registry.ensure_workspace("default").id
    await p.commit(r1, sandbox_row("sb-1", ws, "a"))
    assert registry.get_sandbox("sb-1").host == "a"
    assert [r.id for r in registry.fleet.reservations()] == [r2.id]


async def test_commit_inserts_the_row_and_removes_the_reservation(registry: Registry, clock: FakeClock) -> None:
    register(registry, "a", T0, max_sandboxes=2)
    register(registry, "b", T0, max_sandboxes=2)
    ws = registry.ensure_workspace("default").id
    p = placement(registry, clock)
    r = await p.reserve(BASE, "sb-1")
    assert r.agent == "a"
    await p.commit(r, sandbox_row("sb-1", ws, r.agent))
    row = registry.get_sandbox("sb-1", ws)
    assert (row.host, row.status, row.memory_mib) == ("a", "running", MIB)
    assert registry.fleet.reservations() == []
    # the committed row now counts as a's load (once: not also as a reservation)
    assert (await p.reserve(BASE)).agent == "b"
    assert (await p.reserve(BASE)).agent == "a"
    assert (await p.reserve(BASE)).agent == "b"
    with pytest.raises(HostUnavailable):
        await p.reserve(BASE)  # 1 row + 3 reservations fill the 4 slots


async def test_a_full_fleet_is_a_503_and_nothing_is_inserted(registry: Registry, clock: FakeClock) -> None:
    register(registry, "a", T0, max_sandboxes=1)
    register(registry, "b", T0, total_mib=MIB - 1)  # a slot, but not the memory
    ws = registry.ensure_workspace("default").id
    registry.add_sandbox(sandbox_row("sb-old", ws, "a"))
    p = placement(registry, clock)
    before = registry.list_sandboxes()
    with pytest.raises(HostUnavailable) as info:
        await p.reserve(BASE, "sb-new")
    err = info.value
    assert err.http_status == 503 and err.code == "capacity" and err.retry_after_s > 0
    assert err.details["live_agents"] == 2
    assert registry.fleet.reservations() == []
    assert registry.list_sandboxes() == before


async def test_silent_and_draining_agents_get_nothing(registry: Registry, clock: FakeClock) -> None:
    register(registry, "a", T0, total_mib=1 << 20)  # the best score, but it stops heartbeating
    register(registry, "b", T0)
    register(registry, "c", T0, total_mib=1 << 20)
    registry.fleet.set_agent_status("c", "draining")
    p = placement(registry, clock)
    assert (await p.reserve(BASE)).agent == "a"
    clock.now = T0 + DEADLINE_S + 1
    register(registry, "b", clock.now)
    register(registry, "c", clock.now)  # a heartbeat keeps "draining"
    assert (await p.reserve(BASE)).agent == "b"
    register(registry, "b", clock.now, max_sandboxes=1)
    with pytest.raises(HostUnavailable) as info:
        await p.reserve(BASE)
    assert info.value.details["live_agents"] == 1  # only b is live and up (and full)


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.005)


async def test_held_reservations_are_renewed_until_they_end(registry: Registry, clock: FakeClock) -> None:
    """A create slower than the TTL keeps its room, and its sandbox (listed by its agent before the row exists)
    is never a stray; one that ended anywhere stops being renewed; a closed (dead) replica renews nothing."""
    register(registry, "a", T0, max_sandboxes=4)
    p = Placement(registry, deadline_s=1e9, ttl_s=10.0, clock=clock, renew_every_s=0.01)
    slow = await p.reserve(BASE, "sb-slow")
    done = await p.reserve(BASE, "sb-done")
    elsewhere = await p.reserve(BASE, "sb-woken")  # a wake's move deletes its reservation with the row's move
    assert p.held == {slow.id, done.id, elsewhere.id}
    clock.now = T0 + 9.0

    def expiry(reservation_id: str) -> float | None:
        return next((r.expires_at for r in registry.fleet.reservations() if r.id == reservation_id), None)

    await _until(lambda: expiry(slow.id) == T0 + 19.0)
    clock.now = T0 + 15.0  # past the first TTL: without renewal sb-slow would be deleted as a stray
    assert unknown_sandboxes(registry.database, ["sb-slow", "sb-stray"], now=clock.now) == ["sb-stray"]
    ws = registry.ensure_workspace("default").id
    await p.commit(done, sandbox_row("sb-done", ws, "a"))
    registry.fleet.release(elsewhere.id)
    await _until(lambda: p.held == {slow.id})  # the one deleted elsewhere was dropped
    await p.close()  # the replica dies: its reservation is not renewed any more and expires
    clock.now = T0 + 30.0
    await asyncio.sleep(0.05)
    expires = expiry(slow.id)
    assert expires is not None and expires < clock.now
    assert unknown_sandboxes(registry.database, ["sb-slow"], now=clock.now) == ["sb-slow"]


async def test_renewal_ends_when_nothing_is_held(registry: Registry, clock: FakeClock) -> None:
    register(registry, "a", T0)
    p = Placement(registry, deadline_s=1e9, ttl_s=10.0, clock=clock, renew_every_s=0.01)
    r = await p.reserve(BASE, "sb-1")
    await p.release(r)
    assert p.held == frozenset()
    await asyncio.sleep(0.05)
    assert [t for t in asyncio.all_tasks() if t.get_name() == "reservation-renewal"] == []  # none left behind
    again = await p.reserve(BASE, "sb-2")  # a new hold starts a new renewal
    clock.now = T0 + 5.0
    await _until(lambda: registry.fleet.reservations()[0].expires_at == T0 + 15.0)
    await p.release(again)
    await p.close()
