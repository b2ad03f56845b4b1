"""Drain and portable hibernation in the control plane, over in-process fake agents sharing one object store, on
a real (SQLite) registry: a drained agent gets no placements and its sandboxes become stored hibernations; the
next request to one wakes it on another agent as the same sandbox (row moved in the reservation's transaction,
stored objects deleted, the old agent forgets it); drain is idempotent and resumable; a stored hibernation is
never marked ``lost``, whether its host goes silent or restarts without it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox.agentapi import models as am
from cryobox.compose.app import create_app
from cryobox.errors import HostUnavailable, NotFound, StoreError
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from tests.support import registry as registry_support
from tests.support.clock import T0, FakeClock
from tests.support.control import DEADLINE_S, Fleetish, made
from tests.support.fake_agent import FakeAgent

__all__ = ["made"]  # fixtures
STORE_S = 0.02
registry = registry_support.sqlite_registry
clock = registry_support.clock


def calls(agent: FakeAgent, method: str) -> int:
    return agent.call_names().count(method)


async def test_drain_marks_the_agent_draining_stores_its_sandboxes_and_placement_skips_it(
    made: Fleetish, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = made
    rows = await c.three_on_a()
    await c.a.pause(rows[1].id)  # paused and running sandboxes both drain
    store = c.a.store_hibernation

    async def slow_store(sandbox_id: str) -> am.StoredHibernation:
        await asyncio.sleep(STORE_S)
        return await store(sandbox_id)

    monkeypatch.setattr(c.a, "store_hibernation", slow_store)  # each copy to the store takes STORE_S on the agent

    report = await c.control.hibernations.drain("a")

    assert report.agent == "a" and report.status == "draining" and report.errors == [] and report.skipped == []
    assert sorted(d.id for d in report.drained) == sorted(r.id for r in rows)
    assert all(d.seconds >= 0 and not d.already for d in report.drained)
    assert all(d.seconds >= STORE_S for d in report.drained)  # each sandbox's drain is timed, its store included
    assert report.seconds >= sum(d.seconds for d in report.drained) - 0.01  # and the whole drain holds them all
    assert c.registry.fleet.get_agent("a").status == "draining"
    for row in rows:
        stored = c.row(row.id)
        assert (stored.host, stored.status, stored.hibernation, stored.hibernation_generation) == (
            "a",
            "hibernated",
            "stored",
            "g1",
        )
        assert stored.egress == row.egress and c.a.sandboxes[row.id].state == "hibernated"
    assert c.stored_keys() == sorted(f"hibernations/{r.id}/manifest.json" for r in rows)

    await c.beat()  # a heartbeat keeps it draining
    assert c.registry.fleet.get_agent("a").status == "draining"
    later = await c.create(9)  # a still has far more free memory, but it is draining
    assert later.host == "b" and calls(c.a, "create") == 3
    assert [(a.name, a.status) for a in await c.control.fleet.agents()] == [("a", "draining"), ("b", "up")]

    await c.control.hibernations.undrain("a")
    assert c.registry.fleet.get_agent("a").status == "up"
    assert (await c.create(10)).host == "a"


async def test_a_request_wakes_a_drained_sandbox_on_another_agent_as_the_same_sandbox(made: Fleetish) -> None:
    c = made
    rows = await c.three_on_a()
    before = {r.id: c.a.sandboxes[r.id] for r in rows}
    await c.control.hibernations.drain("a")

    for row in rows:
        moved, agent = await c.exec(row.id)
        assert agent is c.b and moved.host == "b" and c.row(row.id) == moved
        assert (moved.status, moved.hibernation, moved.hibernation_generation) == ("running", None, None)
        info, old = c.b.sandboxes[row.id], before[row.id]
        assert info.state == "running" and info.id not in c.a.sandboxes  # the old agent forgot it
        same = ("instance_id", "workspace_id", "metadata", "env", "ttl_s", "egress", "created_at", "template")
        assert {k: getattr(info, k) for k in same} == {k: getattr(old, k) for k in same}
        assert await c.b.read_file(row.id, "/root/file") == f"content {row.metadata['n']}".encode()
        assert ("delete", (row.id,)) in c.a.calls
    assert c.stored_keys() == []  # deleted once each row named its new host
    assert c.registry.fleet.reservations() == []
    assert calls(c.b, "wake_stored") == 3
    await c.exec(rows[0].id)  # routed to b now, no second wake
    assert calls(c.b, "wake_stored") == 3
    assert {r.host for r in c.registry.list_sandboxes()} == {"b"}


async def test_drain_is_idempotent_and_finishes_what_a_failed_one_left(made: Fleetish) -> None:
    c = made
    rows = await c.three_on_a()
    c.a.fail_next["store_hibernation"] = StoreError("the object store went away")

    first = await c.control.hibernations.drain("a")

    [failed] = first.errors
    assert failed.code == "store_error" and len(first.drained) == 2
    assert {failed.id, *(d.id for d in first.drained)} == {r.id for r in rows}
    row = c.row(failed.id)
    assert (row.status, row.hibernation) == ("hibernated", "local")  # not portable: it stays where it is
    _, agent = await c.control.route(failed.id, c.ws)
    assert agent is c.a and calls(c.b, "wake_stored") == 0

    second = await c.control.hibernations.drain("a")

    assert second.errors == [] and second.skipped == []
    assert {(d.id, d.already) for d in second.drained} == {(r.id, r.id != failed.id) for r in rows}
    assert all(c.row(r.id).hibernation == "stored" for r in rows)
    assert calls(c.a, "hibernate") == 4 and calls(c.a, "store_hibernation") == 4  # nothing redone

    third = await c.control.hibernations.drain("a")
    assert [d.already for d in third.drained] == [True, True, True] and calls(c.a, "store_hibernation") == 4
    with pytest.raises(NotFound):
        await c.control.hibernations.drain("nobody")


async def test_two_requests_racing_wake_it_once(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")

    results = await asyncio.gather(*(c.exec(row.id) for _ in range(4)))

    assert {r.host for r, _ in results} == {"b"} and calls(c.b, "wake_stored") == 1
    assert c.registry.fleet.reservations() == []


class HeldWake(FakeAgent):
    """Its ``wake_stored`` answers only once ``release`` is set (the sandbox exists on it meanwhile)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def wake_stored(self, spec: am.WakeSpec) -> am.SandboxInfo:
        info = await super().wake_stored(spec)
        self.entered.set()
        await self.release.wait()
        return info


async def test_replicas_racing_move_it_once_and_the_loser_drops_its_copy(registry: Registry, clock: FakeClock) -> None:
    b = HeldWake(name="b", clock=clock)
    c = Fleetish(
        registry, clock, {"a": FakeAgent(name="a", clock=clock), "b": b, "c": FakeAgent(name="c", clock=clock)}
    )
    other = c.replica()
    try:
        await c.beat()
        [row, *_] = await c.three_on_a()
        await c.control.hibernations.drain("a")
        first = asyncio.create_task(c.exec(row.id))  # replica 1 reserves b; b holds its answer
        await asyncio.wait_for(b.entered.wait(), 5)
        with pytest.raises(HostUnavailable) as busy:  # replica 2 meanwhile: the sandbox holds a reservation
            await other.route(row.id, c.ws)
        assert busy.value.details["sandbox_id"] == row.id and busy.value.retry_after_s > 0

        clock.now += 61  # replica 1 stalls past its reservation's life: replica 2 may place it now
        c.agents["c"].memory_mib = 1 << 20
        await c.beat()
        moved, agent = await other.route(row.id, c.ws)
        assert agent is c.agents["c"] and moved.host == "c"
        b.release.set()
        late, late_agent = await first  # its move finds the row moved: it drops its copy and follows the row
        assert late.host == "c" and late_agent is c.agents["c"]
        assert c.row(row.id).host == "c" and row.id not in b.sandboxes and row.id in c.agents["c"].sandboxes
        assert c.registry.fleet.reservations() == []
    finally:
        b.release.set()
        await other.fleet.close()
        await c.close()


async def test_a_move_finishes_when_the_request_that_started_it_goes_away(registry: Registry, clock: FakeClock) -> None:
    b = HeldWake(name="b", clock=clock)
    c = Fleetish(registry, clock, {"a": FakeAgent(name="a", clock=clock), "b": b})
    try:
        await c.beat()
        [row, *_] = await c.three_on_a()
        await c.control.hibernations.drain("a")
        request = asyncio.create_task(c.exec(row.id))
        await asyncio.wait_for(b.entered.wait(), 5)
        request.cancel()  # the client hung up while b was waking it
        with pytest.raises(asyncio.CancelledError):
            await request
        b.release.set()
        await c.control.hibernations.close()  # waits for the move
        assert c.row(row.id).host == "b" and row.id in b.sandboxes and row.id not in c.a.sandboxes
        assert c.registry.fleet.reservations() == [] and f"hibernations/{row.id}/manifest.json" not in c.stored_keys()
    finally:
        b.release.set()
        await c.close()


async def test_a_stored_hibernation_survives_its_host_going_silent_and_the_host_forgets_it_on_return(
    made: Fleetish, clock: FakeClock
) -> None:
    c = made
    stored, kept = (await c.three_on_a())[:2]
    await c.control.hibernations.drain("a")
    c.registry.update_sandbox(kept.id, hibernation="local")  # as if its copy never reached the store
    await c.a.wake(kept.id)

    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")
    assert await c.control.fleet.check_stale() == ["a"]

    assert c.registry.fleet.get_agent("a").status == "down"
    assert c.row(stored.id).status == "hibernated"  # portable: not lost with its host
    assert c.row(kept.id).status == "lost"
    for call in ("hibernate", "delete"):  # (an in-process fake is always reachable: make it look like it is not)
        c.a.fail_next[call] = HostUnavailable("agent a is unreachable")
    moved, agent = await c.exec(stored.id)  # its host is down: it wakes elsewhere
    assert agent is c.b and moved.host == "b"
    assert stored.id in c.a.sandboxes and c.a.fail_next == {}  # a was unreachable, so it still has its copy

    c.a.boot_id = "a-restarted"
    clock.now += 1
    await c.beat("a")  # registers again, reporting the copy: it is told to forget it
    assert stored.id not in c.a.sandboxes and stored.id in c.b.sandboxes
    assert c.row(stored.id).host == "b" and c.row(stored.id).status == "running"


async def test_a_restarted_host_that_lacks_a_stored_hibernation_keeps_it_hibernated(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")
    await c.control.hibernations.undrain("a")
    del c.a.sandboxes[row.id]  # its restart lost the local copy
    c.a.boot_id = "a-restarted"
    await c.beat("a")

    assert c.row(row.id).status == "hibernated" and c.row(row.id).hibernation == "stored"
    moved, agent = await c.exec(row.id)  # a is up but lacks it: placed (a wins on memory) and imported there
    assert agent is c.a and moved.host == "a" and calls(c.a, "wake_stored") == 1
    assert c.row(row.id).hibernation is None and c.stored_keys() != []  # the two others are still stored
    assert f"hibernations/{row.id}/manifest.json" not in c.stored_keys()


async def test_a_stored_hibernation_on_an_up_host_that_has_it_wakes_there(made: Fleetish) -> None:
    c = made
    [row, *_] = await c.three_on_a()
    await c.control.hibernations.drain("a")
    await c.control.hibernations.undrain("a")
    _, agent = await c.exec(row.id)
    assert agent is c.a and calls(c.b, "wake_stored") == 0 and c.a.sandboxes[row.id].state == "running"
    await c.beat("a")
    assert (c.row(row.id).status, c.row(row.id).hibernation) == ("running", None)


async def test_deleting_a_stored_hibernation_deletes_its_objects(made: Fleetish) -> None:
    c = made
    rows = await c.three_on_a()
    await c.control.hibernations.drain("a")
    await c.control.delete(rows[0].id, c.ws)
    assert c.stored_keys() == sorted(f"hibernations/{r.id}/manifest.json" for r in rows[1:])


async def test_drain_routes(registry: Registry, clock: FakeClock, tmp_path: Path) -> None:
    c = Fleetish(registry, clock)
    app = create_app(c.control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x")
    await c.beat()
    _, key = registry.create_key(c.ws)
    try:
        await c.three_on_a()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ctl") as client:
            assert (await client.post("/v1/agents/a/drain")).status_code == 401
            auth = {"Authorization": f"Bearer {key}"}
            assert (await client.post("/v1/agents/nobody/drain", headers=auth)).status_code == 404
            drained = await client.post("/v1/agents/a/drain", headers=auth)
            assert drained.status_code == 200, drained.text
            body = drained.json()
            assert set(body) == {"agent", "status", "count", "drained", "skipped", "errors", "seconds"}
            assert (body["agent"], body["status"], body["count"]) == ("a", "draining", 3)
            assert all(set(d) == {"id", "seconds", "already"} for d in body["drained"])
            undrained = await client.post("/v1/agents/a/undrain", headers=auth)
            assert undrained.json() == {"name": "a", "status": "up"}
    finally:
        await c.close()
