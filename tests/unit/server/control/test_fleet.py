"""The control plane over a fleet of in-process fake agents: placement, routing, liveness, reconciliation, the
reaper and forks across agents, on a real (SQLite) registry.

Agents register and heartbeat exactly as ``cryobox serve`` does it (``Fleet.heartbeat(heartbeat_of(agent))``
with the app's registration hook wired); where time matters one injected clock drives the fleet, placement,
snapshots and the agents.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import pytest

from cryobox.agentapi import models as am
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import wire_registration
from cryobox.errors import GuestError, HostUnavailable, NotFound, StateError
from cryobox.registry import Registry, SandboxRow, SnapshotRow, TemplateRow
from cryobox.server.control.createrequest import CreateRequest
from cryobox.server.control.forks import ForkControl
from cryobox.server.control.sandboxes import ControlPlane
from tests.support import registry as registry_support
from tests.support.clock import T0, FakeClock
from tests.support.control import DEADLINE_S, control_plane
from tests.support.fake_agent import FakeAgent


class Cluster:
    """A control plane, its fake agents by name and a workspace."""

    def __init__(self, registry: Registry, control: ControlPlane, agents: dict[str, FakeAgent]) -> None:
        self.registry = registry
        self.control = control
        self.forks = ForkControl(control)
        self.agents = agents
        self.ws = registry.ensure_workspace("alpha").id
        self.other_ws = registry.ensure_workspace("beta").id

    async def beat(self, name: str) -> am.HeartbeatReply:
        return await self.control.fleet.heartbeat(await heartbeat_of(self.agents[name]))

    async def create(self, template: str = "base", **kw: Any) -> SandboxRow:
        request = CreateRequest(
            template=template,
            workspace_id=self.ws,
            metadata=kw.pop("metadata", {}),
            env={},
            ttl_s=kw.pop("ttl_s", None),
            persistent=False,
            **kw,
        )
        return await self.control.create(request)

    def rows(self, host: str | None = None) -> list[SandboxRow]:
        return self.registry.list_sandboxes(host=host)

    def status(self, sandbox_id: str) -> str:
        return self.registry.get_sandbox(sandbox_id).status

    def creates(self, name: str) -> list[am.CreateSpec]:
        return [args[0] for method, args in self.agents[name].calls if method == "create"]

    def held(self, name: str) -> set[str]:
        return set(self.agents[name].sandboxes)

    def total_calls(self, method: str) -> int:
        return sum(agent.call_names().count(method) for agent in self.agents.values())


class MakeCluster(Protocol):
    def __call__(self, clock: FakeClock | None = None, **agents: FakeAgent) -> Awaitable[Cluster]: ...


# the shared fixtures (registry_support), bound here under the names the tests ask for
registry = registry_support.sqlite_registry
clock = registry_support.clock


@pytest.fixture
async def cluster(registry: Registry) -> AsyncIterator[MakeCluster]:
    """``await cluster(a=FakeAgent(...), ...)``: a control plane over those agents (``build_control``'s, as the
    CLI assembles it), each registered by a heartbeat; with ``clock=`` on that clock instead of ``time.time``."""
    made: list[ControlPlane] = []

    async def make(clock: FakeClock | None = None, **agents: FakeAgent) -> Cluster:
        control = control_plane(registry, agents, clock=time.time if clock is None else clock)
        wire_registration(control)
        made.append(control)
        c = Cluster(registry, control, agents)
        for name in agents:
            assert (await c.beat(name)).reconciled  # a registration
        return c

    try:
        yield make
    finally:
        for control in made:
            await control.snapshots.close()
            await control.templates.close()
            await control.fleet.close()


def fake(name: str, clock: Callable[[], float] = time.time, *, max_sandboxes: int = 16) -> FakeAgent:
    return FakeAgent(name=name, max_sandboxes=max_sandboxes, clock=clock)


# -- create ------------------------------------------------------------------------------------------------------


async def test_create_commits_the_row_on_the_chosen_agent_and_leaves_no_reservation(cluster: MakeCluster) -> None:
    c = await cluster(a=fake("a"), b=fake("b"))
    first = await c.create(metadata={"k": "v"})
    assert first.host == "a"  # equal agents: the first by name
    row = c.registry.get_sandbox(first.id, c.ws)
    assert row == first
    assert c.control.fleet.routes.get(first.id, c.ws) == row  # the first exec is routed without a registry read
    assert (row.status, row.template, row.metadata, row.memory_mib) == ("running", "base", {"k": "v"}, 512)
    assert c.held("a") == {first.id} and c.held("b") == set()
    [spec] = c.creates("a")
    assert (spec.sandbox_id, spec.template, spec.workspace_id) == (first.id, "base", c.ws)
    assert c.registry.fleet.reservations() == []

    second = await c.create()  # a's committed sandbox now counts against it
    assert second.host == "b" and c.held("b") == {second.id}
    assert c.registry.fleet.reservations() == []


async def test_two_agents_of_three_slots_take_exactly_six_of_eight_concurrent_creates(cluster: MakeCluster) -> None:
    c = await cluster(a=fake("a", max_sandboxes=3), b=fake("b", max_sandboxes=3))
    for agent in c.agents.values():
        agent.max_sandboxes = 100  # the agents themselves would take more: only placement keeps them at 3
    results = await asyncio.gather(*(c.create() for _ in range(8)), return_exceptions=True)

    made = [r for r in results if isinstance(r, SandboxRow)]
    refused = [r for r in results if isinstance(r, HostUnavailable)]
    assert len(made) == 6 and len(refused) == 2, results
    assert all("live_agents" in err.details for err in refused)  # refused by placement, never sent to an agent
    assert c.total_calls("create") == 6
    assert len(c.held("a")) == 3 and len(c.held("b")) == 3
    assert {r.id for r in made} == c.held("a") | c.held("b")
    assert sorted((r.id, r.host) for r in c.rows()) == sorted((r.id, r.host) for r in made)
    assert {r.host for r in c.rows() if r.id in c.held("a")} == {"a"}
    assert c.registry.fleet.reservations() == []


async def test_a_create_no_agent_can_serve_creates_nothing(cluster: MakeCluster) -> None:
    c = await cluster(a=fake("a"), b=fake("b"))
    # a template the registry knows and calls ready, but no agent serves
    c.registry.upsert_template(
        TemplateRow(name="gpu", generation="g1", cpus=1, memory_mib=512, status="ready", path="")
    )
    with pytest.raises(HostUnavailable):
        await c.create("gpu")
    with pytest.raises(NotFound):
        await c.create("nope")  # not even a row
    # a snapshot taken on a template generation no agent serves any more: waiting cannot help, so 409, not 503
    c.registry.add_snapshot(
        SnapshotRow(id="snap-old", workspace_id=c.ws, template="base", path="", location="stored", generation="g0")
    )
    with pytest.raises(StateError) as refused:
        await c.create(from_snapshot="snap-old")
    assert refused.value.http_status == 409
    assert refused.value.details["generation"] == "g0" and refused.value.details["served"] == {"a": "g1", "b": "g1"}
    assert c.total_calls("create") == 0
    assert c.rows() == [] and c.registry.fleet.reservations() == []
    assert c.held("a") == set() and c.held("b") == set()


async def test_a_create_the_agent_fails_releases_its_reservation(cluster: MakeCluster) -> None:
    c = await cluster(a=fake("a", max_sandboxes=1))
    c.agents["a"].fail_next["create"] = GuestError("the restore failed")
    with pytest.raises(GuestError):
        await c.create()
    assert c.rows() == [] and c.registry.fleet.reservations() == []
    assert (await c.create()).host == "a"  # the one slot is free again


async def test_a_create_from_a_snapshot_restores_where_its_files_are(cluster: MakeCluster, clock: FakeClock) -> None:
    a, b = fake("a", clock, max_sandboxes=2), fake("b", clock)
    shared_store(a, b)
    c = await cluster(clock, a=a, b=b)
    parent = await c.create()
    assert parent.host == "a"
    a.fail_next["store_snapshot"] = GuestError("the object store is unreachable")  # it stays local for now
    snap = await c.control.snapshots.take(parent.id, c.ws, labels={}, retain=False, quiesce=False)
    await c.control.snapshots.wait_stored(snap.id)
    assert c.registry.get_snapshot(snap.id).location == "local"
    b.memory_mib = 1 << 20  # b outscores a by far more than the snapshot's locality bonus
    await c.beat("b")

    child = await c.create(from_snapshot=snap.id)  # only a has the files
    assert child.host == "a" and child.from_snapshot == snap.id
    ref = c.creates("a")[-1].from_snapshot
    assert ref is not None and (ref.id, ref.stored) == (snap.id, False)
    with pytest.raises(HostUnavailable):
        await c.create(from_snapshot=snap.id)  # a is full: b cannot restore a snapshot it has no files of
    assert c.creates("b") == []

    c.control.snapshots.store_later(c.registry.get_snapshot(snap.id))
    await c.control.snapshots.wait_stored(snap.id)
    assert c.registry.get_snapshot(snap.id).location == "stored"
    elsewhere = await c.create(from_snapshot=snap.id)  # now any agent serving its generation restores it
    assert elsewhere.host == "b" and elsewhere.id in c.held("b")
    [spec] = c.creates("b")
    assert spec.from_snapshot is not None and (spec.from_snapshot.id, spec.from_snapshot.stored) == (snap.id, True)
    assert c.registry.fleet.reservations() == []


# -- reads and delete --------------------------------------------------------------------------------------------


async def test_get_and_list_merge_the_agents_live_state(cluster: MakeCluster) -> None:
    c = await cluster(a=fake("a"))
    s1, s2 = await c.create(), await c.create()
    await c.agents["a"].pause(s1.id)  # the agent knows; the row still says running
    assert c.status(s1.id) == "running"

    assert (await c.control.get(s1.id, c.ws)).status == "paused"
    assert (await c.control.get(s2.id, c.ws)).status == "running"
    listed = {r.id: r.status for r in await c.control.list_rows(c.ws, None, {})}
    assert listed == {s1.id: "paused", s2.id: "running"}
    assert [r.id for r in await c.control.list_rows(c.ws, "paused", {})] == [s1.id]
    assert [r.id for r in await c.control.list_rows(c.ws, "running", {})] == [s2.id]
    assert c.status(s1.id) == "running"  # reading does not write
    with pytest.raises(NotFound):
        await c.control.get(s1.id, c.other_ws)
    assert await c.control.list_rows(c.other_ws, None, {}) == []


async def test_delete_removes_the_row_its_snapshots_and_the_agents_sandbox(cluster: MakeCluster) -> None:
    c = await cluster(a=fake("a"), b=fake("b"))
    s1, s2 = await c.create(), await c.create()
    assert (s1.host, s2.host) == ("a", "b")
    snap = await c.control.snapshots.take(s1.id, c.ws, labels={}, retain=False, quiesce=False)
    await c.control.snapshots.wait_stored(snap.id)

    with pytest.raises(NotFound):
        await c.control.delete(s1.id, c.other_ws)
    assert c.held("a") == {s1.id} and c.status(s1.id) == "running"

    await c.control.delete(s1.id, c.ws)
    with pytest.raises(NotFound):
        c.registry.get_sandbox(s1.id)
    with pytest.raises(NotFound):
        c.registry.get_snapshot(snap.id)
    assert c.held("a") == set() and ("delete", (s1.id,)) in c.agents["a"].calls
    assert snap.id not in c.agents["a"].snapshots
    assert c.held("b") == {s2.id} and [r.id for r in c.rows()] == [s2.id]
    assert "delete" not in c.agents["b"].call_names()


# -- liveness and reconciliation ---------------------------------------------------------------------------------


async def fleet_with_a_silent_agent(cluster: MakeCluster, clock: FakeClock) -> tuple[Cluster, list[SandboxRow]]:
    """Agents a and b with two sandboxes each; then a stops heartbeating past the deadline and is marked down."""
    c = await cluster(clock, a=fake("a", clock), b=fake("b", clock))
    made = [await c.create() for _ in range(4)]
    assert sorted(r.host for r in made) == ["a", "a", "b", "b"]
    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")  # b keeps reporting
    assert await c.control.fleet.check_stale() == ["a"]
    return c, made


async def test_a_silent_agents_sandboxes_are_lost_and_creates_go_elsewhere(
    cluster: MakeCluster, clock: FakeClock
) -> None:
    c = await cluster(clock, a=fake("a", clock), b=fake("b", clock))
    made = [await c.create() for _ in range(4)]
    on_a = [r for r in made if r.host == "a"]
    b_before = c.rows("b")
    assert len(on_a) == 2 and len(b_before) == 2

    clock.now = T0 + DEADLINE_S  # exactly at the deadline: still alive
    assert await c.control.fleet.check_stale() == []
    clock.now = T0 + DEADLINE_S + 1
    await c.beat("b")
    assert await c.control.fleet.check_stale() == ["a"]
    assert await c.control.fleet.check_stale() == []  # idempotent

    assert c.registry.fleet.get_agent("a").status == "down"
    assert {c.status(r.id) for r in on_a} == {"lost"}
    assert c.rows("b") == b_before  # row for row
    for row in on_a:
        with pytest.raises(StateError) as info:
            await c.control.route(row.id, c.ws)
        assert info.value.state == "lost" and info.value.details["host"] == "a"
        assert (await c.control.get(row.id, c.ws)).status == "lost"

    a_creates = len(c.creates("a"))
    later = [await c.create() for _ in range(3)]
    assert {r.host for r in later} == {"b"}
    assert len(c.creates("a")) == a_creates  # a was never asked


@pytest.mark.parametrize("restarted", [True, False], ids=["new-boot-id", "same-boot-id"])
async def test_an_agent_coming_back_reconciles_only_its_own_rows(
    cluster: MakeCluster, clock: FakeClock, restarted: bool
) -> None:
    c, made = await fleet_with_a_silent_agent(cluster, clock)
    survivor, gone = [r for r in made if r.host == "a"]
    a = c.agents["a"]
    if restarted:
        a.boot_id = "a-after-restart"
    del a.sandboxes[gone.id]  # did not survive: the agent reports only the other one
    later = await c.create()  # lands on b meanwhile
    assert later.host == "b"
    b_before = c.rows("b")

    clock.now += 1
    reply = await c.beat("a")

    assert reply.reconciled
    assert c.registry.fleet.get_agent("a").status == "up"
    assert c.status(survivor.id) == "running"
    assert c.status(gone.id) == "lost"
    assert c.rows("b") == b_before  # row for row: another agent's registration never touches b's rows
    row, agent = await c.control.route(survivor.id, c.ws)
    assert agent is a and row.status == "running"
    with pytest.raises(StateError):
        await c.control.route(gone.id, c.ws)


async def test_a_routine_heartbeat_updates_states_but_does_not_mark_absent_rows_lost(
    cluster: MakeCluster, clock: FakeClock
) -> None:
    c = await cluster(clock, a=fake("a", clock))
    s1, s2, s3 = [await c.create() for _ in range(3)]
    a = c.agents["a"]
    await a.pause(s1.id)
    del a.sandboxes[s2.id]  # e.g. a delete in flight: the row goes next
    clock.now += 2

    reply = await c.beat("a")
    assert not reply.reconciled
    assert (c.status(s1.id), c.status(s2.id), c.status(s3.id)) == ("paused", "running", "running")

    a.boot_id = "a-after-restart"  # the same report at a registration is authoritative
    clock.now += 2
    assert (await c.beat("a")).reconciled
    assert (c.status(s1.id), c.status(s2.id), c.status(s3.id)) == ("paused", "lost", "running")


async def test_a_report_taken_before_a_change_does_not_undo_it(cluster: MakeCluster, clock: FakeClock) -> None:
    """A beat's report taken just before the control plane hibernated a sandbox (at its timeout) and written just
    after: the row stays hibernated (it was set back to running until the next beat, and a command that arrived
    meanwhile woke a sandbox that does not wake on requests: E2B's timeouts test, once)."""
    c = await cluster(clock, a=fake("a", clock))
    made = await c.create()
    clock.now += 2
    await c.beat("a")
    stale = await heartbeat_of(c.agents["a"])  # taken while it runs
    await c.control.hibernate(made.id, None)
    assert c.status(made.id) == "hibernated"
    await c.control.fleet.heartbeat(stale)  # written after the hibernation
    assert c.status(made.id) == "hibernated"


# -- the TTL reaper ----------------------------------------------------------------------------------------------


async def test_the_reaper_deletes_what_the_agent_says_expired_and_keeps_busy_sandboxes(
    cluster: MakeCluster, clock: FakeClock
) -> None:
    c = await cluster(clock, a=fake("a", clock), b=fake("b", clock))
    idle, busy, fresh, other = [await c.create(ttl_s=60) for _ in range(4)]
    assert (idle.host, busy.host) == ("a", "b")
    clock.now = T0 + 5  # a heartbeat interval or two: the agents stay live
    await c.beat("a")
    await c.beat("b")
    store_a, store_b = c.agents["a"].sandboxes, c.agents["b"].sandboxes
    store_a[idle.id] = store_a[idle.id].model_copy(update={"expired": True, "idle_s": 120.0, "expires_at": T0 - 60})
    # past its expiry time but with requests running: an agent never reports that one expired
    store_b[busy.id] = store_b[busy.id].model_copy(
        update={"expired": False, "in_flight": 2, "idle_s": 0.0, "expires_at": T0 - 60}
    )
    # expired on the agent but without a row (a create being committed): not the reaper's to delete
    await c.agents["a"].create(am.CreateSpec(sandbox_id="sb-norow", template="base", workspace_id=c.ws))
    store_a["sb-norow"] = store_a["sb-norow"].model_copy(update={"expired": True})

    assert (await c.control.reap_expired()).killed == [idle.id]

    with pytest.raises(NotFound):
        c.registry.get_sandbox(idle.id)
    assert idle.id not in c.held("a")
    assert {r.id for r in c.rows()} == {busy.id, fresh.id, other.id}
    assert busy.id in c.held("b") and fresh.id in c.held(fresh.host) and other.id in c.held(other.host)
    assert "sb-norow" in c.held("a")
    assert (await c.control.reap_expired()).killed == []


# -- forks -------------------------------------------------------------------------------------------------------


class SlowStoreAgent(FakeAgent):
    """Its uploads to the object store take a while (as real ones do)."""

    async def store_snapshot(self, snapshot_id: str) -> am.StoredSnapshot:
        await asyncio.sleep(0.05)
        return await super().store_snapshot(snapshot_id)


def shared_store(*agents: FakeAgent) -> None:
    """One object store for the fleet: what one agent stores the others can restore from."""
    stored: set[str] = set()
    manifests: dict[str, str] = {}
    for agent in agents:
        agent.stored, agent.stored_manifests = stored, manifests


async def test_fork_tree_places_what_does_not_fit_on_the_parents_agent_elsewhere(
    cluster: MakeCluster, clock: FakeClock
) -> None:
    a, b = SlowStoreAgent(name="a", max_sandboxes=4, clock=clock), fake("b", clock, max_sandboxes=8)
    shared_store(a, b)  # the children on b must wait for the snapshot to be stored before they restore it
    c = await cluster(clock, a=a, b=b)
    parent = await c.create()
    assert parent.host == "a"  # 1 of a's 4 slots: room for 3 children there

    tree = await c.forks.fork_tree(parent.id, c.ws, count=5, metadata={"job": "j1"})

    assert tree.errors == []
    # the parent's agent first (its children restore from the capture's hot copy), though b has more free memory
    # (without the preference they would alternate, b first: 2 on a, 3 on b)
    hosts = [child.host for child in tree.children]
    assert sorted(hosts) == ["a", "a", "a", "b", "b"]
    [(_, request)] = [args for method, args in a.calls if method == "fork_tree"]
    assert isinstance(request, am.TreeRequest) and len(request.child_ids) == 3
    on_b = c.creates("b")
    assert sorted(spec.sandbox_id for spec in on_b) == sorted(ch.id for ch in tree.children if ch.host == "b")
    for spec in on_b:
        assert spec.from_snapshot is not None
        assert spec.from_snapshot.id == tree.snapshot.id and spec.from_snapshot.stored is True
        assert spec.metadata["cryobox.tree_id"] == tree.tree_id and spec.metadata["job"] == "j1"
        assert spec.metadata["cryobox.parent_id"] == parent.id
    snap = c.registry.get_snapshot(tree.snapshot.id)
    assert (snap.host, snap.location) == ("a", "stored")
    assert tree.snapshot.id in a.stored
    assert len(c.held("a")) == 4 and len(c.held("b")) == 2
    assert {r.id: r.host for r in c.rows()} == {parent.id: "a", **{ch.id: ch.host for ch in tree.children}}
    assert c.registry.fleet.reservations() == []


async def test_fork_tree_reports_children_without_room_per_child(cluster: MakeCluster, clock: FakeClock) -> None:
    a, b = fake("a", clock, max_sandboxes=3), fake("b", clock, max_sandboxes=1)
    shared_store(a, b)
    c = await cluster(clock, a=a, b=b)
    parent = await c.create()
    assert parent.host == "a"

    tree = await c.forks.fork_tree(parent.id, c.ws, count=5, metadata={})  # room for 2 on a, 1 on b

    assert sorted(child.host for child in tree.children) == ["a", "a", "b"]
    assert [index for index, _ in tree.errors] == [3, 4]
    assert all(message for _, message in tree.errors)
    assert c.registry.get_snapshot(tree.snapshot.id).location == "stored"
    assert c.registry.fleet.reservations() == []

    full = await c.forks.fork_tree(parent.id, c.ws, count=2, metadata={})  # nothing left anywhere
    assert full.children == [] and [index for index, _ in full.errors] == [0, 1]
    await c.control.snapshots.wait_stored(full.snapshot.id)
    assert c.registry.get_snapshot(full.snapshot.id).location == "stored"  # the snapshot was still taken
    assert len(c.rows()) == 4 and c.registry.fleet.reservations() == []


async def test_fork_lands_only_on_the_parents_agent(cluster: MakeCluster, clock: FakeClock) -> None:
    a, b = fake("a", clock, max_sandboxes=3), fake("b", clock)
    c = await cluster(clock, a=a, b=b)
    parent = await c.create()
    assert parent.host == "a"
    b.memory_mib = 1 << 20  # b now outscores a by far more than any locality bonus
    await c.beat("b")
    a.max_sandboxes = 100  # a itself would take more: only placement keeps it at its 3

    child = await c.forks.fork(parent.id, c.ws, metadata={"n": "1"})
    assert child.host == "a" and child.boot_mode == "cold"
    assert c.registry.get_sandbox(child.id).host == "a" and child.id in c.held("a")
    await c.forks.fork(parent.id, c.ws, metadata={})  # a's last slot
    assert a.call_names().count("fork") == 2

    with pytest.raises(HostUnavailable) as info:
        await c.forks.fork(parent.id, c.ws, metadata={})  # b has room, but the parent's disk is on a
    assert "live_agents" in info.value.details
    assert a.call_names().count("fork") == 2 and "fork" not in b.call_names() and c.held("b") == set()
    assert len(c.rows()) == 3 and c.registry.fleet.reservations() == []
