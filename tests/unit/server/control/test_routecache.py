"""Exec calls are routed from a second-long cache of running rows (``routecache``) that this process's own commits
invalidate (``registry.watch``), and a call that the cached agent answers "not found" is routed again from the
registry. Both backends: PostgreSQL gives each statement a snapshot of its own, SQLite one per transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import delete, update

from cryobox.agentapi import Agent
from cryobox.errors import NotFound, StateError
from cryobox.registry import Registry, SandboxRow
from cryobox.registry import models as m
from cryobox.registry.watch import _ids_named, watch_sandboxes
from cryobox.server.control.fleet import Fleet, FleetConfig
from cryobox.server.control.routecache import MAX_ROUTES, RouteCache
from tests.support.registry import db_url, open_registry, pg_server, registry, sandbox

__all__ = ["db_url", "pg_server", "registry"]  # fixtures


# -- what this process's commits report ------------------------------------------------------------------------


@pytest.fixture
def reports(registry: Registry) -> Iterator[list[frozenset[str] | None]]:
    seen: list[frozenset[str] | None] = []
    stop = watch_sandboxes(registry.database, seen.append)
    yield seen
    stop()
    stop()  # idempotent


def test_each_commit_reports_the_sandbox_rows_it_changed(
    registry: Registry, reports: list[frozenset[str] | None]
) -> None:
    ws = registry.ensure_workspace("default")
    registry.fleet.heartbeat("a", url="http://a.invalid", boot_id="b", capacity={}, info={}, now=100.0)
    assert reports == []  # rows of other tables are not reported
    registry.add_sandbox(sandbox("sb-1", ws.id, host="a", status="running"))
    registry.add_sandbox(sandbox("sb-2", ws.id, host="a", status="running"))
    assert reports == [frozenset({"sb-1"}), frozenset({"sb-2"})]
    registry.get_sandbox("sb-1")
    registry.list_sandboxes()
    assert len(reports) == 2  # reads report nothing
    registry.update_sandbox("sb-1", status="hibernated")
    registry.delete_sandbox("sb-2")  # a DELETE statement naming its id
    assert reports[2:] == [frozenset({"sb-1"}), frozenset({"sb-2"})]
    registry.fleet.mark_stale(now=1000.0, deadline_s=10.0)  # every row of a host: which ones is not told
    assert reports[4:] == [None]
    with pytest.raises(NotFound):
        registry.update_sandbox("sb-gone", status="running")  # rolled back: nothing changed, nothing told
    assert len(reports) == 5


def test_a_statement_s_rows_are_told_by_its_where() -> None:
    by_ids = update(m.Sandbox).where(m.Sandbox.id.in_(["sb-a", "sb-b"]), m.Sandbox.host == "h")
    assert _ids_named(by_ids.whereclause) == {"sb-a", "sb-b"}
    assert _ids_named(delete(m.Sandbox).where(m.Sandbox.id == "sb-x").whereclause) == {"sb-x"}
    assert _ids_named(update(m.Sandbox).where(m.Sandbox.host.in_(["h"])).whereclause) is None


# -- the cache itself ------------------------------------------------------------------------------------------


def test_the_cache_keeps_running_rows_for_a_second_per_workspace() -> None:
    now = [100.0]
    cache = RouteCache(lambda: now[0])
    running = sandbox("sb-1", "ws-1", host="a", status="running")
    cache.put(sandbox("sb-2", "ws-1", host="a", status="hibernated"), cache.generation())
    cache.put(running, cache.generation())
    assert cache.get("sb-2", "ws-1") is None  # only running rows route without a read
    assert cache.get("sb-1", "ws-1") == running
    assert cache.get("sb-1", None) == running
    assert cache.get("sb-1", "ws-2") is None  # another workspace's caller reads the registry (and gets 404)
    now[0] += 1.0
    assert cache.get("sb-1", "ws-1") is None


def test_a_read_that_raced_a_commit_is_not_kept() -> None:
    cache = RouteCache(lambda: 0.0)
    before = cache.generation()  # a route reads the row ...
    cache.forget(frozenset({"sb-1"}))  # ... a commit changes it meanwhile ...
    cache.put(sandbox("sb-1", "ws", host="a", status="running"), before)  # ... and what was read is stale
    assert cache.get("sb-1", None) is None
    cache.put(sandbox("sb-1", "ws", host="a", status="running"), cache.generation())
    assert cache.get("sb-1", None) is not None
    cache.forget(None)
    assert len(cache) == 0


def test_the_cache_is_bounded() -> None:
    cache = RouteCache(lambda: 0.0)
    for i in range(MAX_ROUTES + 1):
        cache.put(sandbox(f"sb-{i}", "ws", host="a", status="running"), cache.generation())
    assert len(cache) == 1


# -- routing a guest call --------------------------------------------------------------------------------------


class Host:
    """An agent that runs some sandboxes and answers an exec of any other one "not found"."""

    def __init__(self, name: str, sandboxes: set[str]) -> None:
        self.name = name
        self.sandboxes = sandboxes
        self.calls: list[str] = []

    async def exec(self, sandbox_id: str) -> str:
        self.calls.append(sandbox_id)
        if sandbox_id not in self.sandboxes:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return self.name


async def _exec_sb1(agent: Agent) -> str:
    assert isinstance(agent, Host)
    return await agent.exec("sb-1")


EXEC_SB1 = _exec_sb1  # the call an exec route makes, on the fake hosts


def _fleet(registry: Registry, hosts: dict[str, Host]) -> tuple[Fleet, list[str]]:
    for name in hosts:
        registry.fleet.heartbeat(name, url=f"http://{name}.invalid", boot_id="b", capacity={}, info={}, now=100.0)
    fleet = Fleet(registry, FleetConfig(node_token="t"), clock=lambda: 100.0, local=dict(hosts))  # type: ignore[arg-type]
    reads: list[str] = []
    get = registry.get_sandbox

    def counted(sandbox_id: str, workspace_id: str | None = None) -> SandboxRow:
        reads.append(sandbox_id)
        return get(sandbox_id, workspace_id)

    registry.get_sandbox = counted  # type: ignore[method-assign]
    return fleet, reads


async def test_an_exec_is_routed_once_from_the_registry_then_from_the_cache(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    a = Host("a", {"sb-1"})
    fleet, reads = _fleet(registry, {"a": a})
    registry.add_sandbox(sandbox("sb-1", ws.id, host="a", status="running"))
    for _ in range(3):
        assert await fleet.on_guest("sb-1", ws.id, EXEC_SB1) == "a"
    assert reads == ["sb-1"]
    registry.update_sandbox("sb-1", status="running", memory_mib=1024)  # any change by this process: read again
    await fleet.on_guest("sb-1", ws.id, EXEC_SB1)
    assert reads == ["sb-1", "sb-1"]
    with pytest.raises(NotFound):  # the cache never answers for another workspace
        await fleet.on_guest("sb-1", "other", EXEC_SB1)
    await fleet.close()


async def test_a_sandbox_another_replica_moved_is_routed_again_and_reached(registry: Registry, db_url: str) -> None:
    ws = registry.ensure_workspace("default")
    a, b = Host("a", {"sb-1"}), Host("b", set())
    fleet, reads = _fleet(registry, {"a": a, "b": b})
    registry.add_sandbox(sandbox("sb-1", ws.id, host="a", status="running"))
    await fleet.on_guest("sb-1", ws.id, EXEC_SB1)
    other = open_registry(db_url)  # another replica: its commits are not told to this one
    try:
        other.update_sandbox("sb-1", host="b")
        a.sandboxes.clear()
        b.sandboxes.add("sb-1")
        assert await fleet.on_guest("sb-1", ws.id, EXEC_SB1) == "b"
        assert a.calls == ["sb-1", "sb-1"] and b.calls == ["sb-1"]  # the stale route, then the fresh one
        assert reads == ["sb-1", "sb-1"]
        other.delete_sandbox("sb-1")  # gone for real: the agent's "not found" stands, after one more read
        b.sandboxes.clear()
        with pytest.raises(NotFound):
            await fleet.on_guest("sb-1", ws.id, EXEC_SB1)
    finally:
        other.close()
    await fleet.close()


async def test_an_agent_refusal_where_the_registry_agrees_stands(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    a = Host("a", {"sb-1"})
    fleet, reads = _fleet(registry, {"a": a})
    registry.add_sandbox(sandbox("sb-1", ws.id, host="a", status="running"))
    await fleet.on_guest("sb-1", ws.id, EXEC_SB1)

    async def busy(agent: object) -> str:
        raise StateError("sandbox sb-1 is busy", state="snapshotting", required="running")

    with pytest.raises(StateError, match="busy"):
        await fleet.on_guest("sb-1", ws.id, busy)
    assert reads == ["sb-1", "sb-1"]  # checked once against the registry, not retried
    await fleet.close()
