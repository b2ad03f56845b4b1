"""A sandbox's samples and log through the host agent (in-process, as the control plane calls it): 404 for a
sandbox the host does not hold, the observer's history and log as they are, nothing touched, and the observer's
gauges in the agent's scrape; a host without an observer answers empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryobox.agent.observe.sampler import ObserveConfig, SandboxObserver
from cryobox.agentapi import InProcessAgent
from cryobox.agentapi import models as am
from cryobox.agentapi.models_obs import LogQuery
from cryobox.errors import NotFound
from tests.support.fake_host import make_agent
from tests.support.procfs import fake_usage


async def test_samples_and_log_of_a_held_sandbox(tmp_path: Path) -> None:
    rigged = make_agent(tmp_path)
    clock = rigged.rig.clock
    observer = SandboxObserver(
        rigged.rig.service, ObserveConfig(), clock=clock, monotonic=clock, proc=tmp_path / "proc"
    )
    rigged.host.observer = observer
    agent = InProcessAgent(rigged.agent)
    made = await agent.create(am.CreateSpec(sandbox_id="sb-1", template="base", workspace_id="ws", ttl_s=60))
    vm = rigged.rig.vm("sb-1")
    vm._pid = 777
    fake_usage(tmp_path / "proc", 777, utime=0, rss_kib=10)
    await observer.tick()
    clock.advance(5.0)
    await observer.tick()
    series = await agent.sandbox_metrics("sb-1")
    assert series.sandbox_id == "sb-1" and series.interval_s == 5.0 and len(series.samples) == 1
    assert (await agent.sandbox_metrics("sb-1", start=clock() + 1)).samples == []
    page = await agent.sandbox_logs("sb-1", LogQuery(limit=10))
    assert page.entries[0].source == "agent" and page.entries[0].message.startswith("started: ")
    assert (await agent.get("sb-1")).last_active == made.last_active  # reading is not activity
    assert b'cryobox_sandbox_memory_bytes{sandbox="sb-1"} 10240.0' in await agent.metrics_text()
    with pytest.raises(NotFound):
        await agent.sandbox_metrics("sb-none")
    with pytest.raises(NotFound):
        await agent.sandbox_logs("sb-none", LogQuery())


async def test_a_host_without_an_observer_answers_empty(tmp_path: Path) -> None:
    rigged = make_agent(tmp_path)
    agent = InProcessAgent(rigged.agent)
    await agent.create(am.CreateSpec(sandbox_id="sb-1", template="base", workspace_id="ws"))
    assert (await agent.sandbox_metrics("sb-1")).samples == []
    assert (await agent.sandbox_logs("sb-1", LogQuery())).entries == []
