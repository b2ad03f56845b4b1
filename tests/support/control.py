"""The control plane of the unit tests, assembled by the composition code of ``cryobox serve`` / ``cryobox control``
(:func:`cryobox.compose.parts.build_control`), so a test's control plane is the CLI's with fake agents in this
process, an injected clock where time matters and given quota limits where a test sets them; and
:class:`Fleetish`, a control plane over fake agents ``a`` and ``b`` sharing one object store.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from cryobox.agentapi import Agent
from cryobox.agentapi import models as am
from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import wire_registration
from cryobox.compose.parts import build_control
from cryobox.netpolicy import EgressPolicy
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.registry import QuotaRecords, Registry, SandboxRow
from cryobox.server.control.createrequest import CreateRequest
from cryobox.server.control.fleet import FleetConfig
from cryobox.server.control.quotas import Quota, QuotaGuard
from cryobox.server.control.sandboxes import ControlPlane
from cryobox.server.control.snapshots import RetentionPolicy
from cryobox.server.metrics import Metrics
from tests.support.clock import FakeClock
from tests.support.fake_agent import FakeAgent

DEADLINE_S = 10.0
"""How long an agent stays live without a heartbeat."""
NODE_TOKEN = "t"


def control_plane(
    registry: Registry,
    agents: Mapping[str, Agent] | None = None,
    *,
    config: FleetConfig | None = None,
    clock: Callable[[], float] = time.time,
    retention: RetentionPolicy | None = None,
    objects: ObjectStore | None = None,
    quota: Quota | None = None,
) -> ControlPlane:
    """``build_control`` over ``registry`` with ``agents`` in this process (not yet registered: a test sends
    their heartbeats), on ``clock``; ``quota``: a guard with those limits (``None``: the environment's, as the
    CLI has it). ``config`` defaults to a :data:`DEADLINE_S` deadline and the node token :data:`NODE_TOKEN`."""
    return build_control(
        registry,
        config or FleetConfig(deadline_s=DEADLINE_S, node_token=NODE_TOKEN),
        retention or RetentionPolicy(),
        objects,
        Metrics(),
        local=dict(agents or {}),
        clock=clock,
        quotas=None if quota is None else QuotaGuard(QuotaRecords(registry.database), quota),
    )


async def close_control(control: ControlPlane) -> None:
    """What the app's lifespan closes when it stops, in its order."""
    await control.templates.close()
    await control.snapshots.close()
    await control.hibernations.close()
    await control.fleet.close()


class Fleetish:
    """A control plane over fake agents ``a`` and ``b`` (one object store for all), a workspace, helpers."""

    def __init__(self, registry: Registry, clock: FakeClock, agents: dict[str, FakeAgent] | None = None) -> None:
        self.registry, self.clock = registry, clock
        self.objects: ObjectStore = open_store("memory://")
        self.agents = agents or {name: FakeAgent(name=name, clock=clock) for name in ("a", "b")}
        for agent in self.agents.values():
            agent.objects = self.objects
        self.control = self.replica()
        wire_registration(self.control)
        self.ws = registry.ensure_workspace("alpha").id

    def replica(self) -> ControlPlane:
        """A control plane over the registry and the agents (another replica when called again)."""
        return control_plane(self.registry, self.agents, clock=self.clock, objects=self.objects)

    @property
    def a(self) -> FakeAgent:
        return self.agents["a"]

    @property
    def b(self) -> FakeAgent:
        return self.agents["b"]

    async def beat(self, *names: str) -> None:
        for name in names or tuple(self.agents):
            await self.control.fleet.heartbeat(await heartbeat_of(self.agents[name]))

    async def create(self, n: int) -> SandboxRow:
        request = CreateRequest(
            template="base",
            workspace_id=self.ws,
            metadata={"n": str(n)},
            env={"E": f"v{n}"},
            ttl_s=600 + n,
            persistent=False,
            egress=EgressPolicy(allow=[f"10.{n}.0.0/16"]),
        )
        row = await self.control.create(request)
        await self.agents[row.host].write_file(row.id, "/root/file", f"content {n}".encode())
        return row

    async def three_on_a(self) -> list[SandboxRow]:
        self.a.memory_mib = 1 << 20  # a outscores b for every create
        await self.beat("a")
        made = [await self.create(n) for n in range(3)]
        assert {r.host for r in made} == {"a"}
        return made

    def row(self, sandbox_id: str) -> SandboxRow:
        return self.registry.get_sandbox(sandbox_id)

    def stored_keys(self) -> list[str]:
        return sorted(self.objects.list("hibernations"))

    async def exec(self, sandbox_id: str) -> tuple[SandboxRow, Agent]:
        row, agent = await self.control.route(sandbox_id, self.ws)
        await agent.exec(sandbox_id, am.ExecRequest(cmd="echo hi"))
        return row, agent

    async def close(self) -> None:
        await self.control.hibernations.close()
        await self.control.snapshots.close()
        await self.control.templates.close()
        await self.control.fleet.close()


@pytest.fixture
async def made(registry: Registry, clock: FakeClock) -> AsyncIterator[Fleetish]:
    """A :class:`Fleetish` whose agents have registered (bind with ``registry`` and ``clock``)."""
    cluster = Fleetish(registry, clock)
    await cluster.beat()
    try:
        yield cluster
    finally:
        await cluster.close()
