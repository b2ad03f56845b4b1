"""The console's live data: the metrics sampler (injected clock and exposition), the SSE event stream (fake
sources), exec history (the ring and the route), and the history routes over the app."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from cryobox.agentapi.models_obs import AgentCounters
from cryobox.console.events import Cadence, event_stream
from cryobox.console.sampler import MetricsSampler, parse_sample
from cryobox.server.control.counters import AgentReading, FleetCounters, exposition
from cryobox.server.execlog import ExecHistory, ExecRecord
from cryobox.server.metrics import Metrics
from tests.support import registry as registry_support
from tests.support.console import ConsoleEnv, console_env

registry = registry_support.sqlite_registry
__all__ = ["console_env", "registry"]


def herd_text(faults: int, fetches: int, hits: int, gets: int) -> str:
    """What the control plane appends to its scrape for one live agent ``a`` (the gathered counters)."""
    return agents_text(a=(faults, fetches, hits, gets))


def agents_text(**agents: tuple[int, int, int, int]) -> str:
    readings = tuple(
        AgentReading(name, "ok", AgentCounters(faults=f, chunk_fetches=c, cache_hits=h, store_gets=g))
        for name, (f, c, h, g) in agents.items()
    )
    return exposition(FleetCounters(0.0, readings))


def memory_server_text(faults: int) -> str:
    """A memory server's own series, as ``cryobox serve`` appends its in-process agent's scrape."""
    r = CollectorRegistry()
    Counter("faults", "faults", registry=r).inc(faults)
    return generate_latest(r).decode()


def test_a_sample_reads_the_herd_counters_and_the_create_histogram() -> None:
    metrics = Metrics()
    metrics.observe_create("ok", "restore", 0.3)
    metrics.observe_create("ok", "restore", 4.0)
    gathered = agents_text(a=(10, 3, 7, 4), b=(1, 1, 1, 1))  # two agents' memory servers
    text = metrics.render()[0].decode() + memory_server_text(10) + gathered  # a's also in the scrape, as on serve
    sample = parse_sample(text, 123.4567)
    assert sample["t"] == 123.457
    assert sample["herd"] == {"faults": 11, "chunk_fetches": 4, "cache_hits": 8, "store_gets": 5}
    assert sample["agents"] == {
        "a": {"up": True, "faults": 10, "chunk_fetches": 3, "cache_hits": 7, "store_gets": 4},
        "b": {"up": True, "faults": 1, "chunk_fetches": 1, "cache_hits": 1, "store_gets": 1},
    }
    creates = sample["creates"]
    assert creates["count"] == 2 and abs(creates["sum_s"] - 4.3) < 1e-9
    buckets = dict((le, n) for le, n in creates["buckets"])
    assert buckets[0.2] == 0 and buckets[0.35] == 1 and buckets[5.0] == 2 and buckets[None] == 2
    assert creates["buckets"][-1][0] is None  # +Inf last
    assert [le for le, _ in creates["buckets"][:-1]] == sorted(le for le, _ in creates["buckets"][:-1])
    empty = parse_sample("", 0.0)
    assert empty["herd"] == {"faults": 0, "chunk_fetches": 0, "cache_hits": 0, "store_gets": 0}
    assert empty["agents"] == {}


async def test_the_sampler_keeps_ten_minutes_with_an_injected_clock() -> None:
    now = [1000.0]
    faults = [0]

    async def source() -> str:
        return herd_text(faults[0], 0, 0, 0)

    sampler = MetricsSampler(source, interval_s=2.0, window_s=600.0, clock=lambda: now[0])
    for _ in range(310):
        faults[0] += 1
        now[0] += 2.0
        await sampler.sample_once()
    history = sampler.history()
    assert len(history) == 300  # 10 minutes of 2 s samples
    assert history[0]["t"] == 1000.0 + 2.0 * 11 and history[-1]["t"] == 1000.0 + 2.0 * 310
    assert history[-1]["herd"]["faults"] == 310 and history[0]["herd"]["faults"] == 11
    seq, nothing = await sampler.next_after(sampler.seq, 0.01)
    assert nothing is None and seq == sampler.seq
    waiter = asyncio.create_task(sampler.next_after(sampler.seq, 5.0))
    await asyncio.sleep(0)
    await sampler.sample_once()
    _, fresh = await waiter
    assert fresh is not None and fresh["herd"]["faults"] == 310


async def test_the_sampler_survives_a_failing_source() -> None:
    calls = [0]

    async def source() -> str:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("boom")
        return ""

    sampler = MetricsSampler(source, interval_s=0.01)
    task = asyncio.create_task(sampler.run())
    await asyncio.sleep(0.1)
    task.cancel()
    assert calls[0] >= 2 and len(sampler.history()) >= 1


def parse_events(chunks: list[bytes]) -> list[tuple[str, Any]]:
    out = []
    for block in b"".join(chunks).decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_the_event_stream_sends_changes_heartbeats_and_ends_when_access_ends() -> None:
    now = [0.0]
    sandboxes: list[dict[str, Any]] = []
    allowed = [True]

    async def source() -> str:
        return herd_text(1, 0, 0, 0)

    sampler = MetricsSampler(source)
    await sampler.sample_once()

    async def list_sandboxes() -> list[dict[str, Any]]:
        return list(sandboxes)

    async def list_agents() -> list[dict[str, Any]]:
        return [{"name": "a"}]

    async def still() -> bool:
        return allowed[0]

    async def disconnected() -> bool:
        return False

    stream: AsyncIterator[bytes] = event_stream(
        sandboxes=list_sandboxes,
        agents=list_agents,
        sampler=sampler,
        still_allowed=still,
        disconnected=disconnected,
        cadence=Cadence(poll_s=0.001),
        clock=lambda: now[0],
    )
    assert await anext(stream) == b"retry: 3000\n\n"
    first = parse_events([await anext(stream) for _ in range(3)])
    assert first == [
        ("metrics", sampler.history()[-1]),
        ("sandboxes", {"sandboxes": []}),
        ("agents", {"agents": [{"name": "a"}]}),
    ]

    sandboxes.append({"id": "sbx-1"})
    now[0] += 1.0  # the next poll: the change is sent at once
    changed = parse_events([await anext(stream)])
    assert changed == [("sandboxes", {"sandboxes": [{"id": "sbx-1"}]})]

    await sampler.sample_once()  # a new sample is sent as it comes
    now[0] += 0.5
    assert parse_events([await anext(stream)])[0][0] == "metrics"

    now[0] += 4.6  # 5.1 s since the last sandboxes event, unchanged: sent again (at least every 5 s)
    again = parse_events([await anext(stream)])
    assert again == [("sandboxes", {"sandboxes": [{"id": "sbx-1"}]})]

    allowed[0] = False  # the key was revoked: the next recheck ends the stream
    now[0] += 6.0
    tail = parse_events([chunk async for chunk in stream])
    assert tail[-1] == ("error", {"error": "the session ended or the API key was revoked", "code": "unauthorized"})


async def test_snapshots_and_templates_are_live_events_too() -> None:
    now = [0.0]
    snapshots: list[dict[str, Any]] = []
    templates = [{"name": "base", "status": "ready"}]

    async def source() -> str:
        return herd_text(0, 0, 0, 0)

    async def fixed() -> list[dict[str, Any]]:
        return []

    async def list_snapshots() -> list[dict[str, Any]]:
        return list(snapshots)

    async def list_templates() -> list[dict[str, Any]]:
        return [dict(t) for t in templates]

    async def yes() -> bool:
        return True

    async def no() -> bool:
        return False

    stream: AsyncIterator[bytes] = event_stream(
        sandboxes=fixed,
        agents=fixed,
        snapshots=list_snapshots,
        templates=list_templates,
        sampler=MetricsSampler(source),
        still_allowed=yes,
        disconnected=no,
        cadence=Cadence(poll_s=0.001),
        clock=lambda: now[0],
    )
    assert await anext(stream) == b"retry: 3000\n\n"
    first = parse_events([await anext(stream) for _ in range(4)])
    assert [name for name, _ in first] == ["sandboxes", "agents", "snapshots", "templates"]
    assert first[2][1] == {"snapshots": []} and first[3][1] == {"templates": templates}

    snapshots.append({"id": "snap-1"})
    templates[0]["status"] = "building"
    now[0] += 2.0  # their next poll: both changes are sent
    changed = parse_events([await anext(stream), await anext(stream)])
    assert changed == [
        ("snapshots", {"snapshots": [{"id": "snap-1"}]}),
        ("templates", {"templates": [{"name": "base", "status": "building"}]}),
    ]


def test_exec_history_is_a_ring_of_50_with_tails() -> None:
    history = ExecHistory(max_sandboxes=2)
    for i in range(60):
        history.record("a", ExecRecord(f"echo {i}", 0, float(i), 1.0, "x" * 10_000, "", False))
    runs = history.list("a")
    assert len(runs) == 50 and runs[0].command == "echo 10" and runs[-1].command == "echo 59"
    assert len(runs[-1].stdout_tail) == 4096
    history.record("b", ExecRecord("b", 0, 0.0, 1.0, "", "", False))
    history.record("c", ExecRecord("c", 0, 0.0, 1.0, "", "", False))  # a is least recently used: forgotten
    assert history.list("a") == [] and len(history.list("c")) == 1


async def test_execs_through_the_api_are_listed_for_the_console(console_env: ConsoleEnv) -> None:
    csrf = await console_env.login()
    client = console_env.client
    made = await client.post("/v1/sandboxes", json={"template": "base"}, headers={"X-CSRF-Token": csrf})
    sandbox_id = made.json()["id"]
    for cmd in ("echo hello", "exit 3"):
        await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd}, headers={"X-CSRF-Token": csrf})
    execs = (await client.get(f"/ui/api/sandboxes/{sandbox_id}/execs")).json()["execs"]
    assert [(e["command"], e["exit_code"]) for e in execs] == [("echo hello", 0), ("exit 3", 3)]
    assert execs[0]["stdout_tail"] == "hello\n" and execs[0]["started_at"] > 1e9
    assert set(execs[0]) >= {"command", "exit_code", "started_at", "duration_ms", "stdout_tail", "stderr_tail"}

    other = console_env.registry.ensure_workspace("other").id
    _, key = console_env.registry.create_key(other)
    foreign = await client.get(f"/ui/api/sandboxes/{sandbox_id}/execs", headers={"Authorization": f"Bearer {key}"})
    assert foreign.status_code == 404


async def test_metrics_history_over_the_api(console_env: ConsoleEnv) -> None:
    await console_env.console.sampler.sample_once()
    await console_env.login()
    samples = (await console_env.client.get("/ui/api/metrics/history")).json()["samples"]
    assert len(samples) == 1 and set(samples[0]) == {"t", "herd", "agents", "creates"}
    console_env.client.cookies.clear()
    assert (await console_env.client.get("/ui/api/metrics/history")).status_code == 401


async def test_the_sampler_takes_its_first_sample_one_interval_after_it_starts() -> None:
    """The first sample costs the loop ~0.2 s (the collectors' first run): not while the app is starting."""
    reads: list[float] = []

    async def source() -> str:
        reads.append(time.monotonic())
        return "cryobox_sandboxes 1\n"

    sampler = MetricsSampler(source, interval_s=0.2, window_s=60.0)
    started = time.monotonic()
    runner = asyncio.create_task(sampler.run())
    await asyncio.sleep(0.1)
    assert reads == [] and sampler.history() == []
    seq, sample = await sampler.next_after(0, 5.0)
    runner.cancel()
    assert sample is not None and seq == 1 and reads[0] - started >= 0.2
