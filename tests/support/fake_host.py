"""A :class:`~cryobox.agent.hostagent.agent.HostAgent` over the fake VM layer (:mod:`tests.support.fake_vm`): a real
agent, admission controller and snapshot operations on a :class:`~cryobox.agent.host.startup.Host` whose VMs,
guests and image captures are simulated and whose object store is in memory. No QEMU, no root, no network: the
parts of a host the agent never calls in these tests (volume, slot pool, firewall, localizer) are absent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cryobox.agent.host.startup import Host, HostConfig
from cryobox.agent.hostagent.agent import HostAgent
from cryobox.agent.memory.client import MemoryServerProcess
from cryobox.agent.net.egress.decisions import NoObserver
from cryobox.agent.net.egress.proxy import ProxyEnv
from cryobox.agent.net.egress.resolver import Resolver
from cryobox.agent.net.egress.service import EgressService
from cryobox.agent.sandbox.admission import AdmissionConfig, AdmissionController
from cryobox.agent.vm import Accel
from cryobox.config import Paths
from cryobox.objstore.client import open_store
from tests.support.fake_vm import Rig, make_rig


class FakeMemoryServer:
    """The memory server's figures, without the process."""

    def __init__(self, text: str = "cryobox_faults_total 0.0\n") -> None:
        self.text = text

    async def metrics_text(self) -> str:
        return self.text


@dataclass
class AgentRig:
    rig: Rig
    host: Host
    agent: HostAgent


def make_agent(
    root: Path,
    *,
    max_concurrent: int = 4,
    queue_length: int = 16,
    metrics_sources: list[Callable[[], Awaitable[str]]] | None = None,
) -> AgentRig:
    rig = make_rig(root)
    absent: Any = None
    host = Host(
        config=HostConfig(Paths(root / "data", root / "cache"), accel=Accel.TCG),
        volume=absent,
        hot=rig.factory.hot,
        service=rig.service,
        snapshots=rig.snapshots,
        forking=rig.forking,
        slots=absent,
        firewall=absent,
        egress=EgressService(ProxyEnv(Resolver(None), floor=(), observer=NoObserver())),
        store=open_store("memory://"),
        memserver=cast(MemoryServerProcess, FakeMemoryServer()),
        localizer=absent,
    )
    admission = AdmissionController(
        AdmissionConfig(max_concurrent=max_concurrent, queue_length=queue_length, timeout_s=5.0)
    )
    agent = HostAgent(
        host,
        admission,
        name="host-a",
        memory_mib=4096,
        vcpus=8,
        max_sandboxes=16,
        metrics_sources=metrics_sources,
        isolation="tcg",
    )
    return AgentRig(rig, host, agent)
