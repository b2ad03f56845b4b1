"""fork and fork_tree children go through admission: with 2 restore slots a tree of 6 restores at most 2 children
at once (counted where the children restore, independently of admission) and still runs all 6; a fork's cold boot
waits for a slot like any restore."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from pathlib import Path

import pytest

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.host.startup import HostConfig
from cryobox.agent.sandbox.admission import AdmissionConfig
from cryobox.agent.templates.bake import Template
from cryobox.agentapi import models as am
from cryobox.compose.parts import AgentOptions, boot_agent
from cryobox.config import Paths
from cryobox.image.specs import by_name

CHILDREN = 6


def new(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


@pytest.mark.timeout(300)
async def test_fork_tree_and_fork_children_take_admission_slots(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path_factory.mktemp("forkadm")
    spec = by_name("base")
    assert spec is not None
    config = HostConfig(paths=Paths(data_dir, cache_dir), prespawn=0, net_pool=CHILDREN + 2, templates=(spec,))
    admission = AdmissionConfig(max_concurrent=2, queue_length=16, timeout_s=120)
    host, agent = await boot_agent(config, admission, AgentOptions(name="fork-admission"), print)
    try:
        parent = await agent.create(am.CreateSpec(sandbox_id=new("sb"), template="base", workspace_id="ws"))
        forking = host.forking
        in_flight: list[int] = []  # admission's own view, sampled while the tree restores

        async def sample() -> None:
            while True:
                in_flight.append(agent.admission.running)
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        child_ids = [new("sb") for _ in range(CHILDREN)]
        started = time.monotonic()
        try:
            tree = await agent.fork_tree(
                parent.id, am.TreeRequest(snapshot_id=new("snap"), child_ids=child_ids, tree_id=new("tree"))
            )
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        elapsed = time.monotonic() - started

        assert tree.errors == []
        assert sorted(c.id for c in tree.children) == sorted(child_ids)
        assert 1 <= forking.children_peak <= 2, f"{forking.children_peak} children restored at once (limit 2)"
        assert host.service.restoring_peak <= 2, host.service.restoring_peak
        assert (await agent.capacity()).restores_peak <= 2
        assert max(in_flight) == 2  # the children did queue for (and fill) both slots
        for child in tree.children:
            assert child.state == "running"
            result = await agent.exec(child.id, am.ExecRequest(cmd=f"echo {child.id}"))
            assert (result.exit_code, result.stdout) == (0, f"{child.id}\n")
        print(f"\nfork_tree of {CHILDREN} with 2 restore slots: {elapsed:.1f}s")

        # a fork's cold boot waits for a slot too: with both held it does not start; cancelled, it leaves nothing
        fork_id = new("sb")
        async with agent.admission.slot(), agent.admission.slot():
            fork = asyncio.create_task(agent.fork(parent.id, am.ForkRequest(child_id=fork_id)))
            deadline = time.monotonic() + 30
            while agent.admission.queue_depth == 0 and not fork.done():
                assert time.monotonic() < deadline, "the fork never queued for a slot"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            assert not fork.done() and agent.admission.queue_depth == 1
            assert forking.children_restoring == 0 and fork_id not in host.service.sandboxes
            fork.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fork
        assert agent.admission.running == 0 and agent.admission.queue_depth == 0
        assert list(host.service.factory.run_dir.glob(".fork-*")) == [], "a cancelled fork must remove its disk clone"
    finally:
        await host.close()
    assert find_own_qemus(data_dir / "vol" / "run") == []
