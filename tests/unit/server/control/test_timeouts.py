"""Timeout actions (kill or hibernate at a TTL's expiry), ``auto_wake``, the paused retention and the ``hibernated``
quota, on the control plane over a fake agent and a real (SQLite) registry, one injected clock driving both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import wire_registration
from cryobox.errors import InvalidArgument, NotFound, StateError, WorkspaceQuotaExceeded
from cryobox.registry import Registry, SandboxRow
from cryobox.server.control.createrequest import CreateRequest
from cryobox.server.control.quotas import Quota
from cryobox.server.control.sandboxes import ControlPlane
from cryobox.server.control.snapshots import RetentionPolicy
from cryobox.server.control.timeouts import OnTimeout
from tests.support import registry as registry_support
from tests.support.clock import T0, FakeClock
from tests.support.control import control_plane
from tests.support.fake_agent import FakeAgent

registry = registry_support.sqlite_registry
clock = registry_support.clock
RETENTION_S = 3600.0


class Env:
    def __init__(self, registry: Registry, control: ControlPlane, agent: FakeAgent, clock: FakeClock) -> None:
        self.registry, self.control, self.agent, self.clock = registry, control, agent, clock
        self.ws = registry.ensure_workspace("w").id

    async def create(self, on_timeout: OnTimeout | None = None, ttl_s: int | None = 60) -> SandboxRow:
        request = CreateRequest(
            template="base", workspace_id=self.ws, metadata={}, env={}, ttl_s=ttl_s, persistent=False,
            on_timeout=on_timeout or OnTimeout(),
        )  # fmt: skip
        await self.control.fleet.heartbeat(await heartbeat_of(self.agent))  # live at the clock's time
        return await self.control.create(request)

    def expire(self, sandbox_id: str) -> None:
        """What the agent reports of a sandbox idle past its TTL."""
        store = self.agent.sandboxes
        store[sandbox_id] = store[sandbox_id].model_copy(update={"expired": True, "idle_s": 120.0})

    def row(self, sandbox_id: str) -> SandboxRow:
        return self.registry.get_sandbox(sandbox_id)


@pytest.fixture
async def env(registry: Registry, clock: FakeClock) -> AsyncIterator[Env]:
    agent = FakeAgent(name="a", max_sandboxes=16, clock=clock)
    control = control_plane(
        registry,
        {"a": agent},
        clock=clock,
        retention=RetentionPolicy(paused_s=RETENTION_S),
        quota=Quota(sandboxes=10, hibernated=3),
    )
    wire_registration(control)
    await control.fleet.heartbeat(await heartbeat_of(agent))
    try:
        yield Env(registry, control, agent, clock)
    finally:
        await control.snapshots.close()
        await control.templates.close()
        await control.fleet.close()


async def test_at_its_timeout_a_hibernate_sandbox_is_hibernated_and_a_kill_one_deleted(env: Env) -> None:
    keep = await env.create(OnTimeout("hibernate", auto_wake=False))
    kill = await env.create()
    idle = await env.create(OnTimeout("hibernate"))  # not expired: untouched
    env.expire(keep.id)
    env.expire(kill.id)
    report = await env.control.reap_expired()
    assert (report.hibernated, report.killed, report.refused) == ([keep.id], [kill.id], [])
    assert env.row(keep.id).status == "hibernated" and env.row(keep.id).hibernated_at == T0
    with pytest.raises(NotFound):
        env.row(kill.id)
    assert env.row(idle.id).status == "running"
    assert env.agent.sandboxes[keep.id].state == "hibernated" and kill.id not in env.agent.sandboxes
    again = await env.control.reap_expired()  # a hibernated sandbox is not hibernated (or killed) again
    assert (again.hibernated, again.killed) == ([], [])
    assert env.agent.call_names().count("hibernate") == 1


async def test_a_hibernated_sandbox_without_auto_wake_refuses_requests_until_resumed(env: Env) -> None:
    sleeper = await env.create(OnTimeout("hibernate", auto_wake=False))
    waker = await env.create(OnTimeout("hibernate", auto_wake=True))
    for row in (sleeper, waker):
        await env.control.hibernate(row.id, env.ws)
    with pytest.raises(StateError) as info:
        await env.control.route(sleeper.id, env.ws)  # an exec, a file, a port: wake=True
    assert info.value.http_status == 409 and info.value.details["auto_wake"] is False
    assert env.row(sleeper.id).status == "hibernated" and "wake" not in env.agent.call_names()
    read, _ = await env.control.route(sleeper.id, env.ws, wake=False)  # reads do not need it awake
    assert read.status == "hibernated"
    woken, _ = await env.control.route(waker.id, env.ws)  # auto_wake: any request wakes it
    assert woken.status == "running"
    resumed, _ = await env.control.route(sleeper.id, env.ws, explicit=True)  # resume/connect
    assert resumed.status == "running" and env.row(sleeper.id).hibernated_at is None


async def test_the_paused_retention_deletes_sandboxes_hibernated_too_long(env: Env) -> None:
    old, young = await env.create(OnTimeout("hibernate")), await env.create(OnTimeout("hibernate"))
    await env.control.hibernate(old.id, env.ws)
    env.clock.advance(RETENTION_S / 2)
    await env.control.hibernate(young.id, env.ws)
    legacy = await env.create()
    await env.control.hibernate(legacy.id, env.ws)
    env.registry.update_sandbox(legacy.id, hibernated_at=None)  # hibernated before revision 0013
    report = await env.control.reap_expired()
    assert report.retired == [] and env.row(legacy.id).hibernated_at == env.clock()  # stamped when first seen
    env.clock.advance(RETENTION_S / 2 - 1)
    assert (await env.control.reap_expired()).retired == []
    env.clock.advance(1)
    assert (await env.control.reap_expired()).retired == [old.id]
    with pytest.raises(NotFound):
        env.row(old.id)
    assert old.id not in env.agent.sandboxes
    env.clock.advance(RETENTION_S / 2)
    assert sorted((await env.control.reap_expired()).retired) == sorted([young.id, legacy.id])
    assert env.registry.list_sandboxes() == []


async def test_a_wake_restarts_the_retention_from_the_next_hibernation(env: Env) -> None:
    row = await env.create(OnTimeout("hibernate"))
    await env.control.hibernate(row.id, env.ws)
    env.clock.advance(RETENTION_S - 10)
    await env.control.route(row.id, env.ws)  # woken by a request
    env.clock.advance(20)
    await env.control.hibernate(row.id, env.ws)
    await env.control.hibernate(row.id, env.ws)  # hibernating a hibernated one keeps its stamp
    assert env.row(row.id).hibernated_at == T0 + RETENTION_S + 10
    env.clock.advance(RETENTION_S - 1)
    assert (await env.control.reap_expired()).retired == []
    assert env.row(row.id).status == "hibernated"


async def test_the_hibernated_quota_keeps_an_expired_sandbox_running_and_refuses_explicit_hibernation(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [await env.create(OnTimeout("hibernate")) for _ in range(4)]
    for row in rows[:3]:
        await env.control.hibernate(row.id, env.ws)
    last = rows[3].id
    env.expire(last)
    for _ in range(2):
        report = await env.control.reap_expired()
        assert (report.refused, report.hibernated, report.killed) == ([last], [], [])
    assert env.row(last).status == "running" and last in env.agent.sandboxes  # nothing lost
    assert sum("stays running past its timeout" in r.message for r in caplog.records) == 1  # logged once
    with pytest.raises(WorkspaceQuotaExceeded) as info:
        await env.control.hibernate(last, env.ws)
    assert info.value.details == {"resource": "hibernated", "limit": 3, "used": 3, "requested": 1}
    await env.control.delete(rows[0].id, env.ws)  # room again: the next pass hibernates it
    assert (await env.control.reap_expired()).hibernated == [last]


async def test_the_timeout_action_and_auto_wake_change_through_the_lifecycle_and_are_checked(env: Env) -> None:
    row = await env.create()
    with pytest.raises(InvalidArgument):
        await env.control.update_lifecycle(row.id, env.ws, ttl_s=30, persistent=None, on_timeout="pause")
    assert (env.row(row.id).on_timeout, env.row(row.id).ttl_s) == ("kill", 60)  # nothing changed
    await env.control.update_lifecycle(
        row.id, env.ws, ttl_s=30, persistent=None, on_timeout="hibernate", auto_wake=False
    )
    changed = env.row(row.id)
    assert (changed.on_timeout, changed.auto_wake, changed.ttl_s) == ("hibernate", False, 30)
    with pytest.raises(InvalidArgument):
        OnTimeout("delete")


async def test_a_snapshot_or_fork_of_a_hibernated_sandbox_leaves_it_hibernated(env: Env) -> None:
    row = await env.create(OnTimeout("hibernate", auto_wake=False))
    await env.control.hibernate(row.id, env.ws)
    env.clock.advance(100)
    snapshot = await env.control.snapshots.take(row.id, env.ws, labels={}, retain=False, quiesce=False)
    assert snapshot.sandbox_id == row.id
    after = env.row(row.id)
    assert after.status == "hibernated" and after.hibernated_at == T0 + 100  # back asleep, retention anew
    assert env.agent.call_names().count("wake") == 1 and env.agent.call_names().count("hibernate") == 2
