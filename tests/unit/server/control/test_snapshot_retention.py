"""Snapshot retention in the control plane: RetentionPolicy from the environment, and SnapshotControl's orphan /
sweep / reconcile / delete / store rules on a real (SQLite) registry, with in-process fake agents registered in a
Fleet by their heartbeats, and one injected clock."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from cryobox.agentapi import models as am
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.errors import GuestError, InvalidArgument, NotFound
from cryobox.registry import Registry, SandboxRow, SnapshotRow
from cryobox.server.control.fleet import Fleet, FleetConfig
from cryobox.server.control.snapshots import DEFAULT_GRACE_S, DEFAULT_SWEEP_INTERVAL_S, RetentionPolicy, SnapshotControl
from tests.support import registry as registry_support
from tests.support.clock import T0, FakeClock
from tests.support.fake_agent import FakeAgent

GRACE = 3600.0

# -- RetentionPolicy.from_env ------------------------------------------------------------------------------------


def test_defaults() -> None:
    policy = RetentionPolicy.from_env(env={})
    assert policy == RetentionPolicy()
    assert policy.grace_s == DEFAULT_GRACE_S == 7 * 24 * 3600
    assert policy.sweep_interval_s == DEFAULT_SWEEP_INTERVAL_S == 900


def test_env_values() -> None:
    env = {"CRYOBOX_SNAPSHOT_GRACE_S": "60", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S": "2.5"}
    assert RetentionPolicy.from_env(env=env) == RetentionPolicy(grace_s=60.0, sweep_interval_s=2.5)


def test_empty_env_value_means_default() -> None:
    policy = RetentionPolicy.from_env(env={"CRYOBOX_SNAPSHOT_GRACE_S": "", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S": ""})
    assert policy == RetentionPolicy()


def test_explicit_arguments_win_over_env() -> None:
    env = {"CRYOBOX_SNAPSHOT_GRACE_S": "60", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S": "not even a number"}
    policy = RetentionPolicy.from_env(grace_s=0.0, sweep_interval_s=30.0, env=env)
    assert policy == RetentionPolicy(grace_s=0.0, sweep_interval_s=30.0)
    # one given, the other from env
    assert RetentionPolicy.from_env(sweep_interval_s=5.0, env={"CRYOBOX_SNAPSHOT_GRACE_S": "60"}) == RetentionPolicy(
        grace_s=60.0, sweep_interval_s=5.0
    )


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYOBOX_SNAPSHOT_GRACE_S", "120")
    monkeypatch.delenv("CRYOBOX_ORPHAN_SWEEP_INTERVAL_S", raising=False)
    assert RetentionPolicy.from_env() == RetentionPolicy(grace_s=120.0, sweep_interval_s=DEFAULT_SWEEP_INTERVAL_S)


@pytest.mark.parametrize("name", ["CRYOBOX_SNAPSHOT_GRACE_S", "CRYOBOX_ORPHAN_SWEEP_INTERVAL_S"])
@pytest.mark.parametrize("raw", ["soon", "1d", "-1", "-0.5", "nan"])
def test_bad_env_values(name: str, raw: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        RetentionPolicy.from_env(env={name: raw})


@pytest.mark.parametrize("kw", [{"grace_s": -1.0}, {"sweep_interval_s": -0.1}, {"grace_s": math.nan}])
def test_bad_explicit_values(kw: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        RetentionPolicy.from_env(env={}, **kw)


# -- SnapshotControl ---------------------------------------------------------------------------------------------

HOST = "host-a"
DEADLINE_S = 10.0


def snapshot_info(snapshot_id: str, sandbox_id: str | None) -> am.SnapshotInfo:
    return am.SnapshotInfo(
        id=snapshot_id,
        template="base",
        generation="g1",
        sandbox_id=sandbox_id,
        created_at=T0,
        path=f"/var/lib/cryobox/snapshots/{snapshot_id}",
    )


class Env:
    """A fleet of in-process fake agents (``host-a`` first) and a SnapshotControl over it, on one clock."""

    def __init__(self, registry: Registry, clock: FakeClock, fleet: Fleet, control: SnapshotControl) -> None:
        self.registry = registry
        self.clock = clock
        self.fleet = fleet
        self.control = control
        self.ws = registry.ensure_workspace("alpha").id
        self.other_ws = registry.ensure_workspace("beta").id
        self.beating: set[str] = set()

    @property
    def agent(self) -> FakeAgent:
        return self.agents[HOST]

    @property
    def agents(self) -> dict[str, FakeAgent]:
        return {name: cast(FakeAgent, agent) for name, agent in self.fleet.local.items()}

    async def register(self, name: str, *, beating: bool = True) -> FakeAgent:
        agent = FakeAgent(name=name, clock=self.clock)
        self.fleet.local[name] = agent
        reply = await self.fleet.heartbeat(await heartbeat_of(agent))
        assert reply.reconciled  # a new boot
        if beating:
            self.beating.add(name)
        return agent

    async def advance(self, now: float) -> None:
        """Time passes; the agents that are still alive heartbeat meanwhile."""
        self.clock.now = now
        for name in sorted(self.beating):
            reply = await self.fleet.heartbeat(await heartbeat_of(self.agents[name]))
            assert not reply.reconciled

    def add(self, snapshot_id: str, sandbox_id: str | None = "sbx-1", host: str = HOST, **kw: Any) -> None:
        """A snapshot of ``sandbox_id`` in workspace ``alpha``, with its files on ``host``'s agent (when there)."""
        info = snapshot_info(snapshot_id, sandbox_id)
        if host in self.fleet.local:
            self.agents[host].snapshots[snapshot_id] = info
        self.registry.add_snapshot(
            SnapshotRow(
                id=snapshot_id,
                workspace_id=self.ws,
                template=info.template,
                path=info.path,
                sandbox_id=sandbox_id,
                host=host,
                generation=info.generation,
                **kw,
            )
        )

    def row(self, snapshot_id: str) -> SnapshotRow:
        return self.registry.get_snapshot(snapshot_id)

    def ids(self) -> set[str]:
        return {row.id for row in self.registry.list_snapshots()}

    def deletes(self, host: str = HOST) -> list[tuple[str, bool]]:
        """``(snapshot_id, from_store)`` of every ``delete_snapshot`` the agent got, in order."""
        return [(args[0], args[1]) for name, args in self.agents[host].calls if name == "delete_snapshot"]

    def held(self, host: str = HOST) -> set[str]:
        """The snapshots whose local copy the agent holds."""
        return set(self.agents[host].snapshots)


# the shared fixture (registry_support), bound here under the name the tests ask for
registry = registry_support.sqlite_registry


@pytest.fixture
async def env(registry: Registry) -> AsyncIterator[Env]:
    clock = FakeClock(T0)
    fleet = Fleet(registry, FleetConfig(deadline_s=DEADLINE_S, node_token="t"), clock=clock, local={})
    control = SnapshotControl(registry, fleet, clock, RetentionPolicy(grace_s=GRACE, sweep_interval_s=60.0))
    e = Env(registry, clock, fleet, control)
    await e.register(HOST)
    try:
        yield e
    finally:
        await control.close()
        await fleet.close()


async def test_sandbox_gone_deletes_unretained_and_orphans_retained(env: Env) -> None:
    env.add("snap-a", created_at=1.0)
    env.add("snap-b", created_at=2.0, retain=True)
    env.add("snap-c", created_at=3.0)
    env.add("snap-other", sandbox_id="sbx-2")

    deleted, orphaned = await env.control.sandbox_gone("sbx-1", keep_snapshots=False)

    assert sorted(deleted) == ["snap-a", "snap-c"]
    assert orphaned == ["snap-b"]
    # the home agent drops its copy and, with no object store in the control plane, the stored objects too
    assert sorted(env.deletes()) == [("snap-a", True), ("snap-c", True)]
    assert env.held() == {"snap-b", "snap-other"}
    assert env.ids() == {"snap-b", "snap-other"}
    assert env.row("snap-b").orphaned_at == T0
    assert env.row("snap-b").retain is True
    assert env.row("snap-other").orphaned_at is None


async def test_sandbox_gone_keep_snapshots_orphans_all(env: Env) -> None:
    env.add("snap-a")
    env.add("snap-b", retain=True)
    deleted, orphaned = await env.control.sandbox_gone("sbx-1", keep_snapshots=True)
    assert deleted == []
    assert sorted(orphaned) == ["snap-a", "snap-b"]
    assert env.deletes() == [] and env.held() == {"snap-a", "snap-b"}
    assert env.row("snap-a").orphaned_at == T0 and env.row("snap-b").orphaned_at == T0


async def test_sandbox_gone_keeps_an_earlier_orphan_time(env: Env) -> None:
    env.add("snap-a", orphaned_at=T0 - 10)
    env.clock.now = T0 + 50
    deleted, orphaned = await env.control.sandbox_gone("sbx-1", keep_snapshots=True)
    assert (deleted, orphaned) == ([], ["snap-a"])
    assert env.row("snap-a").orphaned_at == T0 - 10  # the grace period is not restarted


async def test_sandbox_gone_of_unknown_sandbox(env: Env) -> None:
    env.add("snap-a")
    assert await env.control.sandbox_gone("sbx-nope", keep_snapshots=False) == ([], [])
    assert env.ids() == {"snap-a"} and env.deletes() == []


async def test_sweep_waits_for_the_grace_period(env: Env) -> None:
    env.add("snap-a")
    env.add("snap-live", sandbox_id="sbx-2")  # not an orphan: never swept
    await env.control.sandbox_gone("sbx-1", keep_snapshots=True)

    assert await env.control.sweep() == []
    await env.advance(T0 + GRACE - 1)
    assert await env.control.sweep() == []
    assert env.ids() == {"snap-a", "snap-live"} and env.deletes() == []

    await env.advance(T0 + GRACE)
    assert await env.control.sweep() == ["snap-a"]
    assert env.ids() == {"snap-live"}
    assert env.deletes() == [("snap-a", True)]
    assert env.held() == {"snap-live"}

    await env.advance(T0 + 100 * GRACE)
    assert await env.control.sweep() == []
    assert env.ids() == {"snap-live"}


async def test_retained_orphan_is_never_swept_until_released(env: Env) -> None:
    env.add("snap-keep", retain=True)
    await env.control.sandbox_gone("sbx-1", keep_snapshots=False)
    await env.advance(T0 + 1000 * GRACE)
    assert await env.control.sweep() == []
    assert env.ids() == {"snap-keep"}

    row = await env.control.update("snap-keep", env.ws, labels=None, retain=False)  # PATCH {"retain": false}
    assert row.retain is False and row.orphaned_at == T0  # still an orphan, since T0: its grace has ended
    assert await env.control.sweep() == ["snap-keep"]
    assert env.ids() == set() and env.deletes() == [("snap-keep", True)] and env.held() == set()


async def test_released_orphan_still_gets_its_grace(env: Env) -> None:
    env.add("snap-keep", retain=True)
    await env.control.sandbox_gone("sbx-1", keep_snapshots=False)
    await env.advance(T0 + GRACE / 2)
    await env.control.update("snap-keep", env.ws, labels=None, retain=False)
    assert await env.control.sweep() == []
    await env.advance(T0 + GRACE)
    assert await env.control.sweep() == ["snap-keep"]


async def test_sweep_goes_on_when_an_agent_delete_fails(env: Env) -> None:
    env.add("snap-a", orphaned_at=T0, created_at=2.0)  # newest: swept first
    env.add("snap-b", orphaned_at=T0, created_at=1.0)
    env.agent.fail_next["delete_snapshot"] = GuestError("the snapshot directory is busy")
    await env.advance(T0 + GRACE)
    assert sorted(await env.control.sweep()) == ["snap-a", "snap-b"]
    assert env.deletes() == [("snap-a", True), ("snap-b", True)]
    assert env.ids() == set()  # the row goes first ...
    assert env.held() == {"snap-a"}  # ... the copy the agent failed to remove goes at its next registration
    await env.control.reconcile(HOST, env.agent, set())
    assert env.held() == set()


async def test_reconcile_orphans_only_that_hosts_rows_and_prunes_copies_without_rows(env: Env) -> None:
    env.add("snap-live", sandbox_id="sbx-live")
    env.add("snap-dead", sandbox_id="sbx-dead")
    env.add("snap-nosbx", sandbox_id=None)
    env.add("snap-old-orphan", sandbox_id="sbx-dead", orphaned_at=T0 - 5)
    env.add("snap-b-dead", sandbox_id="sbx-dead", host="host-b")  # another host's row: not this host's business
    env.add("snap-b-nosbx", sandbox_id=None, host="host-b")
    for stray in ("snap-stray-1", "snap-stray-2"):  # copies on host-a that no row knows about
        env.agent.snapshots[stray] = snapshot_info(stray, "sbx-dead")
    env.clock.now = T0 + 7
    other_before = env.registry.list_snapshots(host="host-b")

    await env.control.reconcile(HOST, env.agent, {"sbx-live"})

    assert env.row("snap-live").orphaned_at is None
    assert env.row("snap-dead").orphaned_at == T0 + 7
    assert env.row("snap-nosbx").orphaned_at == T0 + 7
    assert env.row("snap-old-orphan").orphaned_at == T0 - 5
    assert env.registry.list_snapshots(host="host-b") == other_before  # row for row
    assert env.held() == {"snap-live", "snap-dead", "snap-nosbx", "snap-old-orphan"}
    prunes = [args for name, args in env.agent.calls if name == "prune_snapshots"]
    assert len(prunes) == 1 and sorted(prunes[0][0]) == sorted(env.ids())
    assert env.ids() == {"snap-live", "snap-dead", "snap-nosbx", "snap-old-orphan", "snap-b-dead", "snap-b-nosbx"}

    # the copies to the object store resume for this host's rows (and only those)
    for snapshot_id in env.ids():
        await env.control.wait_stored(snapshot_id)
    assert {r.id for r in env.registry.list_snapshots(host=HOST) if r.location == "stored"} == env.held()
    assert {r.location for r in env.registry.list_snapshots(host="host-b")} == {"local"}

    # the grace of the new orphans starts at the registration
    await env.advance(T0 + 7 + GRACE - 1)
    assert await env.control.sweep() == ["snap-old-orphan"]
    await env.advance(T0 + 7 + GRACE)
    assert sorted(await env.control.sweep()) == ["snap-dead", "snap-nosbx"]
    assert env.ids() == {"snap-live", "snap-b-dead", "snap-b-nosbx"}


async def test_delete_removes_the_row_then_every_live_agents_copy(env: Env) -> None:
    b = await env.register("host-b")
    c = await env.register("host-c", beating=False)  # stops heartbeating: not live when the delete runs
    env.add("snap-a")
    b.snapshots["snap-a"] = snapshot_info("snap-a", "sbx-1")  # b restored from it: an imported copy
    c.snapshots["snap-a"] = snapshot_info("snap-a", "sbx-1")
    await env.advance(T0 + DEADLINE_S + 1)

    with pytest.raises(NotFound):
        await env.control.delete("snap-a", env.other_ws)
    assert env.ids() == {"snap-a"} and env.deletes() == [] and env.deletes("host-b") == []

    await env.control.delete("snap-a", env.ws)
    assert env.ids() == set()
    assert env.deletes() == [("snap-a", True)]  # the home agent: the stored objects too (no control-plane store)
    assert env.deletes("host-b") == [("snap-a", False)]  # an import: only the local copy
    assert env.deletes("host-c") == []  # silent: its copy goes when it registers again (no row: pruned)
    assert env.held() == set() and env.held("host-b") == set() and env.held("host-c") == {"snap-a"}


async def test_store_later_marks_the_row_stored_after_the_agent_stored_it(env: Env) -> None:
    env.add("snap-a")
    row = env.row("snap-a")
    env.control.store_later(row)
    env.control.store_later(row)  # one job per snapshot
    assert env.row("snap-a").location == "local"  # in the background: not yet
    await env.control.wait_stored("snap-a")
    assert env.row("snap-a").location == "stored"
    assert env.agent.stored == {"snap-a"}
    assert [args for name, args in env.agent.calls if name == "store_snapshot"] == [("snap-a",)]

    env.control.store_later(env.row("snap-a"))  # already stored: nothing to do
    await env.control.wait_stored("snap-a")
    assert env.agent.call_names().count("store_snapshot") == 1


async def test_store_later_of_a_snapshot_the_agent_lost_leaves_it_local(env: Env) -> None:
    env.add("snap-gone")
    del env.agent.snapshots["snap-gone"]
    env.control.store_later(env.row("snap-gone"))
    await env.control.wait_stored("snap-gone")  # no exception: logged
    assert env.row("snap-gone").location == "local"
    assert env.agent.stored == set()
    await env.control.wait_stored("snap-never-heard-of")


async def test_take_records_the_row_on_the_sandboxes_host_and_stores_it(env: Env) -> None:
    await env.agent.create(am.CreateSpec(sandbox_id="sbx-1", template="base", workspace_id=env.ws))
    env.registry.add_sandbox(
        SandboxRow(
            id="sbx-1", workspace_id=env.ws, template="base", cpus=1, memory_mib=512, status="running", host=HOST
        )
    )
    row = await env.control.take("sbx-1", env.ws, labels={"step": "1"}, retain=True, quiesce=False)
    assert (row.host, row.location, row.sandbox_id, row.generation) == (HOST, "local", "sbx-1", "g1")
    assert (row.labels, row.retain) == ({"step": "1"}, True)
    assert row.id in env.held()
    await env.control.wait_stored(row.id)
    assert env.row(row.id).location == "stored"
    with pytest.raises(NotFound):
        await env.control.take("sbx-1", env.other_ws, labels={}, retain=False, quiesce=False)


async def test_update(env: Env) -> None:
    env.add("snap-a", labels={"env": "dev"})
    with pytest.raises(InvalidArgument, match="nothing to update"):
        await env.control.update("snap-a", env.ws, labels=None, retain=None)
    row = await env.control.update("snap-a", env.ws, labels={"env": "prod"}, retain=True)
    assert row.labels == {"env": "prod"} and row.retain is True
    assert env.row("snap-a") == row
    row = await env.control.update("snap-a", env.ws, labels={}, retain=None)
    assert row.labels == {} and row.retain is True


async def test_other_workspace_sees_nothing(env: Env) -> None:
    env.add("snap-a")
    with pytest.raises(NotFound):
        await env.control.get("snap-a", env.other_ws)
    with pytest.raises(NotFound):
        await env.control.ref("snap-a", env.other_ws)
    with pytest.raises(NotFound):
        await env.control.update("snap-a", env.other_ws, labels={"x": "y"}, retain=None)
    with pytest.raises(NotFound):
        await env.control.update("snap-a", env.other_ws, labels=None, retain=None)  # NotFound before "nothing"
    with pytest.raises(NotFound):
        await env.control.delete("snap-a", env.other_ws)
    assert env.deletes() == [] and env.held() == {"snap-a"}
    assert env.row("snap-a").labels == {}
    assert await env.control.list_rows(env.other_ws, None, {}) == []

    assert (await env.control.get("snap-a", env.ws)).id == "snap-a"
    row, ref = await env.control.ref("snap-a", env.ws)
    assert row.id == "snap-a" and ref == am.SnapshotRef(id="snap-a", template="base", stored=False)
    await env.control.delete("snap-a", env.ws)
    assert env.ids() == set() and env.deletes() == [("snap-a", True)]


async def test_missing_snapshot(env: Env) -> None:
    with pytest.raises(NotFound):
        await env.control.get("snap-nope", env.ws)
    with pytest.raises(NotFound):
        await env.control.update("snap-nope", env.ws, labels=None, retain=True)
    with pytest.raises(NotFound):
        await env.control.delete("snap-nope", env.ws)
    with pytest.raises(NotFound):
        await env.control.delete("snap-nope", None)  # no row: nothing is asked of the agents
    assert env.deletes() == []


async def test_list_rows_filters(env: Env) -> None:
    env.add("snap-a", labels={"env": "dev"}, created_at=1.0)
    env.add("snap-b", labels={"env": "prod"}, created_at=2.0)
    env.add("snap-c", sandbox_id="sbx-2", labels={"env": "prod"}, created_at=3.0)
    assert [r.id for r in await env.control.list_rows(env.ws, None, {})] == ["snap-c", "snap-b", "snap-a"]
    assert [r.id for r in await env.control.list_rows(env.ws, "sbx-1", {"env": "prod"})] == ["snap-b"]
