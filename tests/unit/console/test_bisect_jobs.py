"""Bisect jobs: the state machine over a fake platform (counts, failures, cleanup, cancellation, bounds,
workspace scoping), and the real routes over the app with a fake agent (restore, fork tree, exec, cleanup)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import pytest

from cryobox.agentapi import models as am
from cryobox.console.bisect_jobs import BisectJobs
from cryobox.console.bisect_platform import JOB_LABEL
from cryobox.errors import CryoboxError, GuestError, HostUnavailable, NotFound, QuotaExceeded
from tests.support import registry as registry_support
from tests.support.console import ConsoleEnv, console_env

registry = registry_support.sqlite_registry
__all__ = ["console_env", "registry"]


@dataclass
class FakePlatform:
    """Children ``c0..``; the command's exit code per child index comes from ``exits``; ``hang`` makes exec
    wait until cancelled."""

    exits: dict[int, int] = field(default_factory=dict)
    broken: set[int] = field(default_factory=set)
    tree_errors: list[tuple[int, str]] = field(default_factory=list)
    fail_fork: CryoboxError | None = None
    fail_kill: set[str] = field(default_factory=set)
    hang: bool = False
    live: dict[str, dict[str, str]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    async def restore(self, snapshot_id: str, workspace_id: str, metadata: dict[str, str], ttl_s: int) -> str:
        self.calls.append(f"restore {snapshot_id} ttl={ttl_s}")
        self.live["parent"] = dict(metadata)
        return "parent"

    async def fork_tree(
        self, sandbox_id: str, workspace_id: str, count: int, metadata: dict[str, str]
    ) -> tuple[str, list[str], list[tuple[int, str]]]:
        self.calls.append(f"fork_tree {sandbox_id} {count}")
        if self.fail_fork is not None:
            raise self.fail_fork
        made = count - len(self.tree_errors)
        children = [f"c{i}" for i in range(made)]
        for child in children:
            self.live[child] = dict(metadata)
        return "snap-tree", children, list(self.tree_errors)

    async def exec(self, sandbox_id: str, workspace_id: str, command: str, timeout_s: float) -> am.ExecResult:
        index = int(sandbox_id[1:])
        self.started.set()
        if self.hang:
            await asyncio.sleep(3600)
        if index in self.broken:
            raise GuestError("the guest agent vanished")
        code = self.exits.get(index, 0)
        return am.ExecResult(exit_code=code, stdout="", stderr="", duration_ms=5.0)

    async def delete(self, sandbox_id: str, workspace_id: str) -> None:
        self.calls.append(f"delete {sandbox_id}")
        if sandbox_id in self.fail_kill:
            self.fail_kill.discard(sandbox_id)  # fails once: the sweep gets it
            raise HostUnavailable("agent away")
        if self.live.pop(sandbox_id, None) is None:
            raise NotFound(sandbox_id)

    async def delete_snapshot(self, snapshot_id: str, workspace_id: str) -> None:
        self.calls.append(f"delete_snapshot {snapshot_id}")

    async def labelled(self, workspace_id: str, metadata: dict[str, str]) -> list[str]:
        return [i for i, meta in self.live.items() if all(meta.get(k) == v for k, v in metadata.items())]


async def finished(jobs: BisectJobs, job_id: str) -> None:
    await asyncio.wait_for(jobs.wait(job_id), 10)


async def test_a_job_counts_reproductions_and_cleans_up() -> None:
    platform = FakePlatform(exits={1: 1, 3: 2}, broken={2}, tree_errors=[(5, "no room")])
    jobs = BisectJobs(platform)
    job = jobs.start("ws", "snap-a", "false", 6, 30.0)
    assert job.to_json()["state"] == "running" and job.id.startswith("bis_")
    await finished(jobs, job.id)
    view = jobs.get(job.id, "ws").to_json()
    assert view["state"] == "done" and view["error"] is None
    assert (view["count"], view["reproduced"], view["passed"], view["errors"]) == (6, 2, 2, 2)
    assert view["ratio"] == 0.5 and view["finished_at"] is not None
    assert platform.live == {}  # every child and the temporary sandbox deleted
    assert "restore snap-a ttl=630" in platform.calls and "delete_snapshot snap-tree" in platform.calls
    assert platform.calls[-1] == "delete parent"


async def test_all_children_agree() -> None:
    platform = FakePlatform(exits={i: 1 for i in range(4)})
    jobs = BisectJobs(platform)
    job = jobs.start("ws", "snap-a", "test -f /tmp/never", 4, 30.0)
    await finished(jobs, job.id)
    view = job.to_json()
    assert (view["reproduced"], view["passed"], view["errors"], view["ratio"]) == (4, 0, 0, 1.0)
    assert view["verdict"].startswith("all children agree")


async def test_a_failed_fork_tree_fails_the_job_and_still_kills_the_parent() -> None:
    platform = FakePlatform(fail_fork=HostUnavailable("no capacity"))
    jobs = BisectJobs(platform)
    job = jobs.start("ws", "snap-a", "true", 4, 30.0)
    await finished(jobs, job.id)
    assert job.state == "failed" and job.error == "capacity: no capacity"
    assert job.to_json()["ratio"] is None and platform.live == {}


async def test_a_child_whose_kill_failed_is_swept_at_the_end() -> None:
    platform = FakePlatform(fail_kill={"c1"})
    jobs = BisectJobs(platform)
    job = jobs.start("ws", "snap-a", "true", 3, 30.0)
    await finished(jobs, job.id)
    assert job.state == "done" and platform.live == {}
    assert platform.calls.count("delete c1") == 2


async def test_cancelling_stops_running_commands_and_kills_every_child() -> None:
    platform = FakePlatform(hang=True)
    jobs = BisectJobs(platform)
    job = jobs.start("ws", "snap-a", "sleep 1000", 4, 3000.0)
    await asyncio.wait_for(platform.started.wait(), 10)
    await asyncio.wait_for(jobs.close(), 10)
    assert job.state == "failed" and job.error is not None and "cancelled" in job.error
    assert platform.live == {}
    with pytest.raises(CryoboxError):
        jobs.start("ws", "snap-a", "true", 1, 1.0)  # a closed server starts nothing


async def test_jobs_are_bounded_per_workspace_and_scoped() -> None:
    platform = FakePlatform(hang=True)
    jobs = BisectJobs(platform, max_running=2, keep=1)
    first = jobs.start("ws", "snap-a", "x", 1, 30.0)
    jobs.start("ws", "snap-a", "x", 1, 30.0)
    with pytest.raises(QuotaExceeded) as refused:
        jobs.start("ws", "snap-a", "x", 1, 30.0)
    assert refused.value.code == "rate_limited"
    jobs.start("other", "snap-b", "x", 1, 30.0)  # another workspace has its own bound
    with pytest.raises(NotFound):
        jobs.get(first.id, "other")
    await jobs.close()
    platform.hang = False
    jobs2 = BisectJobs(platform, keep=1)
    a = jobs2.start("ws", "snap-a", "x", 1, 30.0)
    await finished(jobs2, a.id)
    b = jobs2.start("ws", "snap-a", "x", 1, 30.0)
    await finished(jobs2, b.id)
    jobs2.start("ws", "snap-a", "x", 1, 30.0)  # only the last finished one is kept
    with pytest.raises(NotFound):
        jobs2.get(a.id, "ws")
    jobs2.get(b.id, "ws")
    await jobs2.close()


async def test_the_bisect_routes_over_the_control_plane(console_env: ConsoleEnv) -> None:
    client = console_env.client
    csrf = {"X-CSRF-Token": await console_env.login()}
    sandbox_id = (await client.post("/v1/sandboxes", json={"template": "base"}, headers=csrf)).json()["id"]
    snap = await client.post(f"/v1/sandboxes/{sandbox_id}/snapshots", json={}, headers=csrf)
    assert snap.status_code == 201, snap.text
    snapshot_id = snap.json()["id"]

    assert (await client.post(f"/v1/snapshots/{snapshot_id}/bisect", json={"command": "exit 1"})).status_code == 403
    bad = await client.post(f"/v1/snapshots/{snapshot_id}/bisect", json={"command": "x", "count": 17}, headers=csrf)
    assert bad.status_code == 400
    missing = await client.post("/v1/snapshots/snap-nope/bisect", json={"command": "x"}, headers=csrf)
    assert missing.status_code == 404

    started = await client.post(
        f"/v1/snapshots/{snapshot_id}/bisect", json={"command": "exit 1", "count": 4}, headers=csrf
    )
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    await asyncio.wait_for(console_env.console.bisects.wait(job_id), 20)
    view = (await client.get(f"/v1/bisects/{job_id}")).json()
    assert view["state"] == "done", view
    assert (view["count"], view["reproduced"], view["passed"], view["errors"]) == (4, 4, 0, 0)
    assert view["snapshot_id"] == snapshot_id
    left = console_env.registry.list_sandboxes(console_env.workspace_id)
    assert [r.id for r in left] == [sandbox_id]  # the temporary parent and its 4 children are gone
    assert not any(JOB_LABEL in r.metadata for r in left)

    other = console_env.registry.ensure_workspace("other").id
    _, key = console_env.registry.create_key(other)
    foreign = await client.get(f"/v1/bisects/{job_id}", headers={"Authorization": f"Bearer {key}"})
    assert foreign.status_code == 404
    await console_env.console.bisects.close()


async def test_stopping_the_app_cancels_running_jobs_and_kills_their_children(console_env: ConsoleEnv) -> None:
    platform = FakePlatform(hang=True)
    console_env.console.bisects = BisectJobs(platform)
    async with console_env.app.router.lifespan_context(console_env.app):
        job = console_env.console.bisects.start(console_env.workspace_id, "snap-a", "sleep 1000", 3, 3000.0)
        await asyncio.wait_for(platform.started.wait(), 10)
        assert job.state == "running"
        # the sampler runs in the app's lifespan too: its first sample comes within a few seconds (not always before
        # the job started, on a loaded machine)
        for _ in range(200):
            if console_env.console.sampler.history():
                break
            await asyncio.sleep(0.05)
        assert console_env.console.sampler.history()
    view = job.to_json()  # (read afresh: the job changed underneath)
    assert view["state"] == "failed" and "cancelled" in str(view["error"])
    assert platform.live == {} and platform.calls[-1] == "delete parent"
