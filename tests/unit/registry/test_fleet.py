"""The fleet's shared state (``Registry.fleet``) on SQLite (a file) and a real throwaway PostgreSQL
(``tests/support/pg.py``).

Agents' heartbeats, stale agents, per-host reconciliation that never touches another host's rows, reservations
with an injected clock, and several "replicas" (Registry instances on one database) reserving at once without
over-booking any agent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from cryobox.errors import HostUnavailable, InvalidArgument, NotFound
from cryobox.netpolicy import EgressPolicy
from cryobox.registry import AgentLoad, HeartbeatOutcome, MoveRecords, Registry, ReservationRow, SandboxRow, SnapshotRow
from tests.support import registry as registry_support
from tests.support.registry import open_registry, sandbox, snapshot

TOTAL_KEY = "memory_total_mib"


# the shared fixtures (registry_support), bound here under the names the tests ask for
pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry


def beat(reg: Registry, name: str, now: float, *, boot_id: str = "boot-1", total_mib: int = 4096) -> HeartbeatOutcome:
    return reg.fleet.heartbeat(
        name,
        url=f"http://{name}.invalid:7070",
        boot_id=boot_id,
        capacity={TOTAL_KEY: total_mib, "vcpus_total": 8},
        info={"version": "test"},
        now=now,
    )


def free_mib(load: AgentLoad) -> int:
    total = load.agent.capacity[TOTAL_KEY]
    assert isinstance(total, int)
    return total - load.committed_memory_mib - load.reserved_memory_mib


def most_free(memory_mib: int, *, pause_s: float = 0.0) -> Callable[[list[AgentLoad]], str | None]:
    """The agent with the most free memory if the request fits there (ties: the first name; loads come sorted)."""

    def choose(loads: list[AgentLoad]) -> str | None:
        if pause_s:
            time.sleep(pause_s)  # widen the window between reading the loads and inserting the reservation
        best = max(loads, key=free_mib, default=None)
        return best.agent.name if best is not None and free_mib(best) >= memory_mib else None

    return choose


def host_state(reg: Registry, hosts: list[str]) -> tuple[list[SandboxRow], list[SnapshotRow]]:
    """Every sandbox and snapshot row of ``hosts``, in a stable order, for row-for-row comparison."""
    sandboxes = [row for host in hosts for row in reg.list_sandboxes(host=host)]
    snapshots = [row for host in hosts for row in reg.list_snapshots(host=host)]
    return sandboxes, snapshots


# -- schema ------------------------------------------------------------------------------------------------------


def test_0004_gives_existing_snapshots_a_local_location(db_url: str) -> None:
    """Rows written before the fleet revision get ``host=''`` and ``location='local'`` from the server defaults."""
    with open_registry(db_url) as reg:
        db = reg.database
        cfg = db._alembic_config()
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003")
        ws = reg.ensure_workspace("old")
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO snapshots (id, workspace_id, sandbox_id, template, parent_id, path, size_bytes, "
                    "pause_ms, labels, retain, created_at, orphaned_at) VALUES ('snap-old', :ws, NULL, 't', NULL, "
                    "'/p', 1, NULL, '{}', false, 1.0, NULL)"
                ),
                {"ws": ws.id},
            )
        reg.migrate()
        assert db.current_revision() == db.head_revision()
        row = reg.get_snapshot("snap-old")
        assert (row.host, row.location, row.generation) == ("", "local", None)
        assert reg.fleet.list_agents() == [] and reg.fleet.reservations() == []
        with db.engine.begin() as conn:  # the downgrade works too, and the upgrade again after it
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0003")
        reg.migrate()
        assert reg.get_snapshot("snap-old").location == "local"


def test_0005_leaves_existing_sandboxes_without_a_hibernation(db_url: str) -> None:
    """Sandbox rows from before revision 0005 have no hibernation, generation or egress; the fields round-trip."""
    with open_registry(db_url) as reg:
        db = reg.database
        cfg = db._alembic_config()
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0004")
        ws = reg.ensure_workspace("old")
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO sandboxes (id, workspace_id, template, cpu, memory_mb, status, metadata, env, "
                    "from_snapshot, boot_ms, boot_mode, host, created_at, persistent, ttl_seconds, expires_at, "
                    "last_active_at, vm_id, guest_ip, instance_id) VALUES ('sb-old', :ws, 't', 1, 512, 'hibernated', "
                    "'{}', '{}', NULL, 1.0, 'restore', 'h', 1.0, false, NULL, NULL, 1.0, NULL, NULL, NULL)"
                ),
                {"ws": ws.id},
            )
        reg.migrate()
        old = reg.get_sandbox("sb-old")
        assert (old.hibernation, old.hibernation_generation, old.egress) == (None, None, None)
        policy = EgressPolicy(allow=["10.0.0.0/8"])
        changed = reg.update_sandbox("sb-old", hibernation="stored", hibernation_generation="g1", egress=policy)
        assert reg.get_sandbox("sb-old") == changed
        assert (changed.hibernation, changed.hibernation_generation, changed.egress) == ("stored", "g1", policy)
        with pytest.raises(InvalidArgument):
            reg.update_sandbox("sb-old", egress=["10.0.0.0/8"])  # a policy, not a list
        with db.engine.begin() as conn:  # the downgrade works too
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        reg.migrate()
        assert reg.get_sandbox("sb-old").hibernation is None


def test_snapshot_fleet_fields_round_trip(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    row = snapshot("snap-1", ws.id, host="h1", location="stored", generation="gen-7")
    registry.add_snapshot(row)
    assert registry.get_snapshot("snap-1") == row
    assert registry.update_snapshot("snap-1", location="local").location == "local"
    registry.add_snapshot(snapshot("snap-2", ws.id, host="h2", created_at=5.0))
    assert [s.id for s in registry.list_snapshots(host="h1")] == ["snap-1"]
    assert [s.id for s in registry.list_snapshots(host="h2")] == ["snap-2"]
    assert registry.list_snapshots(host="h3") == []


# -- agents ------------------------------------------------------------------------------------------------------


def test_heartbeat_new_boot_was_down_and_draining(registry: Registry) -> None:
    fleet = registry.fleet
    assert beat(registry, "h1", 100.0) == HeartbeatOutcome(new_boot=True, was_down=False, status="up")
    agent = fleet.get_agent("h1")
    assert (agent.status, agent.boot_id, agent.heartbeat_at, agent.registered_at) == ("up", "boot-1", 100.0, 100.0)
    assert agent.capacity == {TOTAL_KEY: 4096, "vcpus_total": 8} and agent.info == {"version": "test"}
    assert agent.url == "http://h1.invalid:7070"

    assert beat(registry, "h1", 105.0, total_mib=2048) == HeartbeatOutcome(new_boot=False, was_down=False, status="up")
    agent = fleet.get_agent("h1")
    assert (agent.heartbeat_at, agent.registered_at, agent.capacity[TOTAL_KEY]) == (105.0, 100.0, 2048)

    # the agent restarted: a new boot id
    assert beat(registry, "h1", 110.0, boot_id="boot-2") == HeartbeatOutcome(True, False, "up")
    assert fleet.get_agent("h1").registered_at == 110.0

    # marked down, then heard from again
    assert fleet.set_agent_status("h1", "down").status == "down"
    assert beat(registry, "h1", 120.0, boot_id="boot-2") == HeartbeatOutcome(False, True, "up")
    assert fleet.get_agent("h1").status == "up"

    # draining survives heartbeats (also a new boot); was_down only reflects a previous "down"
    fleet.set_agent_status("h1", "draining")
    assert beat(registry, "h1", 130.0, boot_id="boot-2") == HeartbeatOutcome(False, False, "draining")
    assert beat(registry, "h1", 131.0, boot_id="boot-3") == HeartbeatOutcome(True, False, "draining")
    assert fleet.get_agent("h1").status == "draining"
    fleet.set_agent_status("h1", "down")
    assert beat(registry, "h1", 140.0, boot_id="boot-3") == HeartbeatOutcome(False, True, "up")

    # a late heartbeat does not move heartbeat_at backwards
    beat(registry, "h1", 135.0, boot_id="boot-3")
    assert fleet.get_agent("h1").heartbeat_at == 140.0

    beat(registry, "h0", 150.0)
    assert [a.name for a in fleet.list_agents()] == ["h0", "h1"]
    with pytest.raises(NotFound):
        fleet.get_agent("missing")
    with pytest.raises(NotFound):
        fleet.set_agent_status("missing", "down")
    with pytest.raises(InvalidArgument):
        fleet.set_agent_status("h1", "sleepy")
    with pytest.raises(InvalidArgument):
        beat(registry, " ", 1.0)
    with pytest.raises(InvalidArgument):
        fleet.heartbeat("h1", url="u", boot_id="b", capacity={1: 2}, info={}, now=1.0)  # type: ignore[dict-item]


def test_concurrent_first_heartbeats_register_once(registry: Registry) -> None:
    outcomes: list[HeartbeatOutcome] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            start.wait(timeout=30)
            outcomes.append(beat(registry, "h-new", 100.0 + i))
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(outcomes) == 8
    assert sum(o.new_boot for o in outcomes) == 1
    assert {o.status for o in outcomes} == {"up"}
    agents = registry.fleet.list_agents()
    assert [a.name for a in agents] == ["h-new"] and agents[0].heartbeat_at == 107.0


# -- stale agents ------------------------------------------------------------------------------------------------


def _stale_fleet(reg: Registry) -> str:
    """Agents: fresh (up, 95), stale-up (up, 50), stale-drain (draining, 50), gone (down, 10); rows on each."""
    ws = reg.ensure_workspace("default")
    for name, at in [("fresh", 95.0), ("stale-up", 50.0), ("stale-drain", 50.0), ("gone", 10.0)]:
        beat(reg, name, at)
    reg.fleet.set_agent_status("stale-drain", "draining")
    reg.fleet.set_agent_status("gone", "down")
    statuses = ["starting", "running", "paused", "hibernated", "stopped", "error", "lost"]
    for host in ["fresh", "stale-up", "stale-drain", "gone", "no-agent"]:
        for i, status in enumerate(statuses):
            reg.add_sandbox(sandbox(f"sbx-{host}-{status}", ws.id, host=host, status=status, created_at=float(i)))
    return ws.id


def test_mark_stale_marks_only_stale_agents_rows_lost(registry: Registry) -> None:
    _stale_fleet(registry)
    untouched = ["fresh", "gone", "no-agent"]
    before = host_state(registry, untouched)

    assert registry.fleet.mark_stale(now=100.0, deadline_s=30.0) == ["stale-drain", "stale-up"]

    assert {a.name: a.status for a in registry.fleet.list_agents()} == {
        "fresh": "up",
        "stale-up": "down",
        "stale-drain": "down",
        "gone": "down",
    }
    for host in ["stale-up", "stale-drain"]:
        assert {s.id.removeprefix(f"sbx-{host}-"): s.status for s in registry.list_sandboxes(host=host)} == {
            "starting": "lost",
            "running": "lost",
            "paused": "lost",
            "hibernated": "lost",
            "stopped": "stopped",
            "error": "error",
            "lost": "lost",
        }
    assert host_state(registry, untouched) == before
    assert registry.fleet.mark_stale(now=100.0, deadline_s=30.0) == []  # idempotent
    assert registry.fleet.mark_stale(now=125.0, deadline_s=30.0) == []  # exactly at the deadline: not stale yet
    assert registry.fleet.mark_stale(now=125.1, deadline_s=30.0) == ["fresh"]


def test_stored_hibernations_are_never_lost_and_move_by_compare_and_swap(registry: Registry) -> None:
    ws = registry.ensure_workspace("default").id
    beat(registry, "h1", 50.0)
    beat(registry, "h2", 95.0)
    for name, hibernation in [("stored", "stored"), ("local", "local"), ("other", None)]:
        registry.add_sandbox(sandbox(f"sb-{name}", ws, host="h1", status="hibernated", hibernation=hibernation))
    registry.add_sandbox(sandbox("sb-run", ws, host="h1", status="running"))

    assert registry.fleet.mark_stale(now=100.0, deadline_s=30.0) == ["h1"]
    statuses = {s.id: s.status for s in registry.list_sandboxes(host="h1")}
    assert statuses == {"sb-stored": "hibernated", "sb-local": "lost", "sb-other": "lost", "sb-run": "lost"}
    report = registry.fleet.reconcile_host("h1", {"sb-run": "running"})  # h1 back without it: still portable
    assert "sb-stored" not in report.lost and registry.get_sandbox("sb-stored").status == "hibernated"
    registry.fleet.reconcile_host("h1", {"sb-local": "hibernated"})  # reported hibernated again: local image
    assert registry.get_sandbox("sb-local").hibernation == "local"
    registry.fleet.reconcile_host("h1", {"sb-local": "running"})  # woke: no hibernation any more
    assert registry.get_sandbox("sb-local").hibernation is None

    moves = MoveRecords(registry.database, registry.sealer)
    held = registry.fleet.reserve(
        memory_mib=512, cpus=1, now=96.0, ttl_s=60.0, choose=lambda _: "h2", sandbox_id="sb-stored", live_after=60.0
    )
    with pytest.raises(HostUnavailable):  # one placement of a sandbox at a time
        registry.fleet.reserve(
            memory_mib=512, cpus=1, now=96.0, ttl_s=60.0, choose=lambda _: "h2", sandbox_id="sb-stored", live_after=60.0
        )
    assert moves.elsewhere("h2", ["sb-stored", "sb-run"]) == ["sb-run"]  # one is on its way here: not stray
    assert moves.move(held.id, "sb-stored", from_host="h2", to_host="h2", changes={"status": "running"}) is None
    moved = moves.move(held.id, "sb-stored", from_host="h1", to_host="h2", changes={"status": "running"})
    assert moved is not None and (moved.host, moved.status, moved.hibernation) == ("h2", "running", None)
    assert registry.fleet.reservations() == []
    assert moves.move(held.id, "sb-stored", from_host="h1", to_host="h2", changes={"status": "running"}) is None
    assert moves.elsewhere("h1", ["sb-stored", "sb-run", "sb-none"]) == ["sb-stored"]
    assert not moves.stored("sb-run", "h1", "g1")  # not hibernated
    policy = EgressPolicy(allow=["10.0.0.0/8"])
    assert moves.hibernated("sb-run", "h1", policy) and moves.stored("sb-run", "h1", "g1")
    row = registry.get_sandbox("sb-run")
    assert (row.status, row.hibernation, row.hibernation_generation, row.egress) == (
        "hibernated",
        "stored",
        "g1",
        policy,
    )
    assert not moves.hibernated("sb-run", "h2", None)  # another host's row
    registry.update_sandbox("sb-run", hibernated_at=5.0)  # hibernated at its timeout, say: a drain keeps the stamp
    assert moves.hibernated("sb-run", "h1", policy) and registry.get_sandbox("sb-run").hibernated_at == 5.0
    registry.update_sandbox("sb-run", status="running")
    assert registry.get_sandbox("sb-run").hibernated_at is None  # woken: no stamp
    assert moves.hibernated("sb-run", "h1", policy)  # hibernated by the drain: stamped now
    stamped = registry.get_sandbox("sb-run").hibernated_at
    assert stamped is not None and stamped > 5.0


def test_mark_stale_from_two_replicas_at_once(db_url: str) -> None:
    with open_registry(db_url) as first, open_registry(db_url) as second:
        first.migrate()
        ws = first.ensure_workspace("default")
        for i in range(6):
            beat(first, f"h{i}", 10.0 if i % 2 else 99.0)
            for j in range(20):
                first.add_sandbox(sandbox(f"sbx-{i}-{j}", ws.id, host=f"h{i}", status="running"))
        results: list[list[str]] = []
        errors: list[BaseException] = []
        start = threading.Barrier(8)

        def worker(reg: Registry) -> None:
            try:
                start.wait(timeout=30)
                results.append(reg.fleet.mark_stale(now=100.0, deadline_s=30.0))
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(reg,)) for reg in [first, second] * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert sorted(name for names in results for name in names) == ["h1", "h3", "h5"]  # each marked once
        lost = {s.host for s in second.list_sandboxes(status="lost")}
        assert lost == {"h1", "h3", "h5"}
        assert len(second.list_sandboxes(status="lost")) == 60 and len(second.list_sandboxes(status="running")) == 60


# -- per-host reconciliation ---------------------------------------------------------------------------------------


def _two_hosts(reg: Registry, tmp_path: Path) -> str:
    ws = reg.ensure_workspace("default")
    for host in ["h1", "h2"]:
        beat(reg, host, 100.0)
        for status in ["running", "lost", "paused", "hibernated", "stopped", "error", "starting"]:
            reg.add_sandbox(sandbox(f"sbx-{host}-{status}", ws.id, host=host, status=status))
        kept = tmp_path / "snapshots" / f"{host}-kept"
        kept.mkdir(parents=True)
        reg.add_snapshot(snapshot(f"snap-{host}-kept", ws.id, path=str(kept), host=host))
        reg.add_snapshot(snapshot(f"snap-{host}-gone", ws.id, path=str(tmp_path / "no" / host), host=host))
        reg.add_snapshot(
            snapshot(f"snap-{host}-stored", ws.id, path=str(tmp_path / "no" / host), host=host, location="stored")
        )
    return ws.id


def exists(path: str) -> bool:
    return Path(path).is_dir()


def test_reconcile_host_touches_only_its_host(registry: Registry, tmp_path: Path) -> None:
    _two_hosts(registry, tmp_path)
    other = host_state(registry, ["h2", ""])
    reported = {
        "sbx-h1-running": "running",
        "sbx-h1-lost": "running",  # a lost row comes back
        "sbx-h1-starting": "paused",
        "sbx-h2-running": "stopped",  # another host's row: ignored
        "sbx-h2-lost": "running",
        "sbx-nowhere": "running",  # no row at all: ignored
    }
    report = registry.fleet.reconcile_host("h1", reported, snapshot_dir_exists=exists)
    assert report.updated == ["sbx-h1-lost", "sbx-h1-starting"]
    assert report.lost == ["sbx-h1-hibernated", "sbx-h1-paused"]
    assert report.deleted_snapshots == ["snap-h1-gone"]
    assert {s.id.removeprefix("sbx-h1-"): s.status for s in registry.list_sandboxes(host="h1")} == {
        "running": "running",
        "lost": "running",
        "starting": "paused",
        "paused": "lost",
        "hibernated": "lost",
        "stopped": "stopped",
        "error": "error",
    }
    assert sorted(s.id for s in registry.list_snapshots(host="h1")) == ["snap-h1-kept", "snap-h1-stored"]
    assert host_state(registry, ["h2", ""]) == other

    again = registry.fleet.reconcile_host("h1", reported, snapshot_dir_exists=exists)
    assert (again.updated, again.lost, again.deleted_snapshots) == ([], [], [])

    # a routine heartbeat: reported rows are refreshed, absent ones left alone
    routine = registry.fleet.reconcile_host("h1", {"sbx-h1-running": "paused"}, absent_status=None)
    assert (routine.updated, routine.lost, routine.deleted_snapshots) == (["sbx-h1-running"], [], [])
    assert registry.get_sandbox("sbx-h1-lost").status == "running"  # not reported, untouched
    registry.fleet.reconcile_host("h1", {"sbx-h1-running": "running"}, absent_status=None)

    # the agent restarted: nothing it does not report survives; without snapshot_dir_exists snapshots stay
    rebooted = registry.fleet.reconcile_host("h1", {"sbx-h1-running": "running"}, absent_status="stopped")
    assert rebooted.lost == ["sbx-h1-hibernated", "sbx-h1-lost", "sbx-h1-paused", "sbx-h1-starting"]
    assert rebooted.updated == [] and rebooted.deleted_snapshots == []
    assert {s.status for s in registry.list_sandboxes(host="h1") if s.id != "sbx-h1-running"} == {"stopped", "error"}
    assert host_state(registry, ["h2", ""]) == other
    with pytest.raises(InvalidArgument):
        registry.fleet.reconcile_host("h1", {"sbx-h1-running": ""})


def test_registry_reconcile_touches_only_its_host(registry: Registry, tmp_path: Path) -> None:
    _two_hosts(registry, tmp_path)
    other = host_state(registry, ["h2"])
    report = registry.reconcile(exists, {"sbx-h1-running", "sbx-h2-paused"}, host="h1")
    assert report.deleted_snapshots == ["snap-h1-gone"]  # the stored one stays, h2's stay
    assert report.stopped_sandboxes == [
        "sbx-h1-hibernated",
        "sbx-h1-lost",
        "sbx-h1-paused",
        "sbx-h1-starting",
    ]
    assert {s.id: s.status for s in registry.list_sandboxes(host="h1")}["sbx-h1-running"] == "running"
    assert host_state(registry, ["h2"]) == other
    assert registry.reconcile(exists, set(), host="nobody") == type(report)()


def test_list_sandboxes_by_host(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    registry.add_sandbox(sandbox("sbx-1", ws.id, host="h1", created_at=1.0, status="running"))
    registry.add_sandbox(sandbox("sbx-2", ws.id, host="h2", created_at=2.0, status="running"))
    registry.add_sandbox(sandbox("sbx-3", ws.id, host="h1", created_at=3.0, status="stopped"))
    assert [s.id for s in registry.list_sandboxes(host="h1")] == ["sbx-1", "sbx-3"]
    assert [s.id for s in registry.list_sandboxes(ws.id, "running", None, "h1")] == ["sbx-1"]
    assert registry.list_sandboxes(host="") == []


# -- reservations --------------------------------------------------------------------------------------------------


def test_reserve_commit_release_and_expiry(registry: Registry) -> None:
    fleet = registry.fleet
    ws = registry.ensure_workspace("default")
    beat(registry, "a", 100.0, total_mib=4096)
    beat(registry, "b", 100.0, total_mib=2048)
    beat(registry, "old", 10.0)  # up, but its heartbeat is older than live_after
    beat(registry, "drain", 100.0)
    fleet.set_agent_status("drain", "draining")
    registry.add_sandbox(sandbox("sbx-run", ws.id, host="a", status="running", memory_mib=1100))
    registry.add_sandbox(sandbox("sbx-hib", ws.id, host="a", status="hibernated", memory_mib=3000))  # not counted
    registry.add_sandbox(sandbox("sbx-stop", ws.id, host="b", status="stopped", memory_mib=2000))  # not counted

    seen: list[list[AgentLoad]] = []

    def spy(memory_mib: int) -> Callable[[list[AgentLoad]], str | None]:
        inner = most_free(memory_mib)

        def choose(loads: list[AgentLoad]) -> str | None:
            seen.append(loads)
            return inner(loads)

        return choose

    first = fleet.reserve(memory_mib=1024, cpus=2, now=200.0, ttl_s=30.0, choose=spy(1024), live_after=60.0)
    assert first.id.startswith("rsv-") and first.agent == "a"
    assert first == ReservationRow(first.id, "a", 1024, 2, 200.0, 230.0, None)
    loads = {load.agent.name: load for load in seen[-1]}
    assert sorted(loads) == ["a", "b"]  # not the stale one, not the draining one
    assert (loads["a"].committed_memory_mib, loads["a"].committed_cpus, loads["a"].sandboxes) == (1100, 1, 1)
    assert (loads["a"].reserved_memory_mib, loads["b"].committed_memory_mib, loads["b"].sandboxes) == (0, 0, 0)

    second = fleet.reserve(
        memory_mib=1024, cpus=1, now=201.0, ttl_s=10.0, choose=spy(1024), live_after=60.0, sandbox_id="sbx-new"
    )
    assert (second.agent, second.sandbox_id, second.expires_at) == ("b", "sbx-new", 211.0)
    third = fleet.reserve(memory_mib=512, cpus=1, now=202.0, ttl_s=30.0, choose=spy(512), live_after=60.0)
    assert third.agent == "a"  # a: 4096-1100-1024 = 1972 free, b: 2048-1024 = 1024
    loads = {load.agent.name: load for load in seen[-1]}
    assert (loads["a"].reserved_memory_mib, loads["a"].reserved_cpus, loads["a"].reservations) == (1024, 2, 1)
    assert [r.id for r in fleet.reservations()] == [first.id, second.id, third.id]
    assert [r.id for r in fleet.reservations("b")] == [second.id]

    # commit: the sandbox row replaces the reservation in the load
    fleet.commit(first.id, sandbox("sbx-c", ws.id, host="a", status="starting", memory_mib=1024))
    assert registry.get_sandbox("sbx-c").host == "a"
    assert [r.id for r in fleet.reservations()] == [second.id, third.id]
    fleet.reserve(memory_mib=1, cpus=0, now=203.0, ttl_s=30.0, choose=spy(1), live_after=60.0)
    loads = {load.agent.name: load for load in seen[-1]}
    assert (loads["a"].committed_memory_mib, loads["a"].reserved_memory_mib) == (2124, 512)

    # release: idempotent
    fleet.release(third.id)
    fleet.release(third.id)
    assert third.id not in {r.id for r in fleet.reservations()}

    # expiry: b's reservation expires at 211 (<= now deletes it), so b has its 2048 MiB again
    assert fleet.reservations("b") == [second]
    fleet.reserve(memory_mib=1, cpus=0, now=211.0, ttl_s=30.0, choose=lambda _: "a", live_after=60.0)
    assert fleet.reservations("b") == []
    fleet.reserve(memory_mib=1, cpus=0, now=212.0, ttl_s=30.0, choose=spy(1), live_after=60.0)
    assert {load.agent.name: free_mib(load) for load in seen[-1]}["b"] == 2048

    # committing an expired (already deleted) reservation still inserts the row
    fleet.commit(second.id, sandbox("sbx-late", ws.id, host="b", status="running"))
    assert registry.get_sandbox("sbx-late").status == "running"

    # an expired reservation is listed until the next reserve deletes it
    soon = fleet.reserve(memory_mib=100, cpus=0, now=300.0, ttl_s=5.0, choose=lambda _: "b", live_after=60.0)
    fleet.reserve(memory_mib=1, cpus=0, now=304.0, ttl_s=50.0, choose=spy(1), live_after=60.0)
    assert {load.agent.name: load.reserved_memory_mib for load in seen[-1]}["b"] == 100  # not expired at 304
    assert soon in fleet.reservations("b")
    fleet.reserve(memory_mib=1, cpus=0, now=305.0, ttl_s=50.0, choose=spy(1), live_after=60.0)
    assert {load.agent.name: load.reserved_memory_mib for load in seen[-1]}["b"] == 0
    assert soon not in fleet.reservations()


def test_reserve_refused_inserts_nothing(registry: Registry) -> None:
    fleet = registry.fleet
    beat(registry, "a", 100.0, total_mib=1024)
    beat(registry, "b", 100.0, total_mib=512)
    held = fleet.reserve(memory_mib=512, cpus=1, now=100.0, ttl_s=60.0, choose=lambda _: "a", live_after=0.0)
    before = fleet.reservations()
    with pytest.raises(HostUnavailable) as caught:
        fleet.reserve(memory_mib=2048, cpus=1, now=101.0, ttl_s=60.0, choose=most_free(2048), live_after=0.0)
    assert caught.value.retry_after_s == 1.0 and caught.value.http_status == 503
    assert caught.value.details["free_memory_mib"] == {"a": 512, "b": 512}
    assert caught.value.details["memory_mib"] == 2048
    assert fleet.reservations() == before == [held]

    with pytest.raises(HostUnavailable):  # no live agent at all
        fleet.reserve(memory_mib=1, cpus=1, now=101.0, ttl_s=60.0, choose=most_free(1), live_after=1000.0)
    with pytest.raises(InvalidArgument, match="not a live agent"):
        fleet.reserve(memory_mib=1, cpus=1, now=101.0, ttl_s=60.0, choose=lambda _: "zzz", live_after=0.0)
    with pytest.raises(InvalidArgument):
        fleet.reserve(memory_mib=-1, cpus=1, now=101.0, ttl_s=60.0, choose=most_free(1), live_after=0.0)
    with pytest.raises(InvalidArgument):
        fleet.reserve(memory_mib=1, cpus=1, now=101.0, ttl_s=0.0, choose=most_free(1), live_after=0.0)
    assert fleet.reservations() == [held]


# -- several replicas at once --------------------------------------------------------------------------------------

AGENTS = {"a": 4096, "b": 3072, "c": 2048}
REQUEST_MIB = 512
THREADS_PER_REPLICA = 8
ATTEMPTS_PER_THREAD = 3


def test_replicas_never_over_book(db_url: str) -> None:
    """Two Registry instances ("replicas"), 8 threads each, reserving (and committing half) against 3 agents.

    Supply: a has 4096 MiB minus a running 1024 MiB sandbox, b 3072, c 2048 = 8192 MiB = 16 requests of 512 MiB.
    Demand: 2 x 8 x 3 = 48 requests, so exactly 16 succeed and every agent ends exactly full, never over.
    """
    with open_registry(db_url) as first, open_registry(db_url) as second:
        first.migrate()
        ws = first.ensure_workspace("default")
        for name, total in AGENTS.items():
            beat(first, name, 100.0, total_mib=total)
        first.add_sandbox(sandbox("sbx-pre", ws.id, host="a", status="running", memory_mib=1024))
        first.add_sandbox(sandbox("sbx-old", ws.id, host="b", status="stopped", memory_mib=3072))  # holds nothing
        supply = (sum(AGENTS.values()) - 1024) // REQUEST_MIB

        won: list[ReservationRow] = []
        refused: list[HostUnavailable] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        start = threading.Barrier(2 * THREADS_PER_REPLICA)

        def worker(reg: Registry, index: int) -> None:
            try:
                start.wait(timeout=30)
                for attempt in range(ATTEMPTS_PER_THREAD):
                    try:
                        row = reg.fleet.reserve(
                            memory_mib=REQUEST_MIB,
                            cpus=1,
                            now=200.0,
                            ttl_s=60.0,
                            choose=most_free(REQUEST_MIB, pause_s=0.002),
                            live_after=50.0,
                        )
                    except HostUnavailable as err:
                        with lock:
                            refused.append(err)
                        continue
                    with lock:
                        won.append(row)
                    if attempt % 2 == 0:  # half become sandbox rows: the swap must keep the load exact
                        sandbox_id = f"sbx-{id(reg)}-{index}-{attempt}"
                        reg.fleet.commit(
                            row.id,
                            sandbox(sandbox_id, ws.id, host=row.agent, status="starting", memory_mib=REQUEST_MIB),
                        )
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [
            threading.Thread(target=worker, args=(reg, i))
            for reg in (first, second)
            for i in range(THREADS_PER_REPLICA)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        demand = 2 * THREADS_PER_REPLICA * ATTEMPTS_PER_THREAD
        assert len(won) == supply == 16
        assert len(refused) == demand - supply
        assert len({r.id for r in won}) == supply

        for name, total in AGENTS.items():
            reserved = sum(r.memory_mib for r in second.fleet.reservations(name))
            committed = sum(
                s.memory_mib for s in second.list_sandboxes(host=name) if s.status in ("starting", "running", "paused")
            )
            assert reserved + committed <= total, f"agent {name} over-booked: {reserved} + {committed} > {total}"
            assert reserved + committed == total  # demand exceeded supply: every agent is exactly full
        assert len(second.list_sandboxes(status="starting")) + len(second.fleet.reservations()) == supply
