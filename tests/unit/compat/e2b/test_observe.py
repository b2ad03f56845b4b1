"""E2B's metrics and logs routes over a fake agent, in the shapes the pinned SDK parses: ``SandboxMetric`` s in a
time range (``end`` takes in its whole second), the newest sample of many sandboxes (``/sandboxes/metrics``
before ``/sandboxes/{id}``), v2 log entries with E2B's cursor and direction, the deprecated v1 logs in both
shapes, and E2B's error shape for bad queries and unknown sandboxes."""

from __future__ import annotations

import httpx

from cryobox.agentapi.models_obs import MetricSample
from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures
T0 = 1_700_000_000.0


def e2b(env: Env) -> dict[str, str]:
    key = env.client.headers["Authorization"].split()[1]
    return {"X-API-Key": key, "Authorization": ""}


async def sandbox(env: Env) -> str:
    made = await env.client.post("/e2b/v2/sandboxes", json={"templateID": "base"}, headers=e2b(env))
    assert made.status_code == 201, made.text
    return str(made.json()["sandboxID"])


def sample(t: float, pct: float = 12.5) -> MetricSample:
    return MetricSample(
        timestamp=t,
        cpu_count=2,
        cpu_pct=pct,
        memory_bytes=9,
        mem_total=512 << 20,
        mem_used=100 << 20,
        mem_cache=10 << 20,
        disk_total=1 << 30,
        disk_used=1 << 29,
    )


async def get(env: Env, path: str, **params: str | int) -> httpx.Response:
    return await env.client.get(f"/e2b{path}", params=params, headers=e2b(env))


async def test_metrics_in_e2b_shape(env: Env) -> None:
    sid = await sandbox(env)
    env.agent.samples[sid] = [sample(T0), sample(T0 + 5.5), sample(T0 + 10.25, 80.0)]
    every = await get(env, f"/sandboxes/{sid}/metrics")
    assert every.status_code == 200 and len(every.json()) == 3
    assert every.json()[0] == {
        "timestamp": "2023-11-14T22:13:20Z",
        "timestampUnix": int(T0),
        "cpuCount": 2,
        "cpuUsedPct": 12.5,
        "memUsed": 100 << 20,
        "memTotal": 512 << 20,
        "memCache": 10 << 20,
        "diskUsed": 1 << 29,
        "diskTotal": 1 << 30,
    }
    ranged = (await get(env, f"/sandboxes/{sid}/metrics", start=int(T0) + 1, end=int(T0) + 10)).json()
    assert [m["timestampUnix"] for m in ranged] == [int(T0) + 5, int(T0) + 10]  # end takes in its second
    assert (await get(env, f"/sandboxes/{sid}/metrics", start=9, end=1)).json()["code"] == 400
    unknown = await get(env, "/sandboxes/sb-nope/metrics")
    assert unknown.status_code == 404 and unknown.json()["code"] == 404


async def test_the_newest_sample_of_many(env: Env) -> None:
    one, two, quiet = await sandbox(env), await sandbox(env), await sandbox(env)
    env.agent.samples[one] = [sample(T0), sample(T0 + 5, 99.0)]
    env.agent.samples[two] = [sample(T0 + 1, 1.0)]
    got = await get(env, "/sandboxes/metrics", sandbox_ids=f"{one},{two},{quiet},sb-nope")
    assert got.status_code == 200, got.text
    found = got.json()["sandboxes"]
    assert set(found) == {one, two} and found[one]["cpuUsedPct"] == 99.0 and found[two]["cpuUsedPct"] == 1.0
    assert (await get(env, "/sandboxes/metrics")).status_code == 400
    many = ",".join(f"sb-{i}" for i in range(101))
    assert (await get(env, "/sandboxes/metrics", sandbox_ids=many)).status_code == 400


async def test_logs_v2_and_v1(env: Env) -> None:
    sid = await sandbox(env)
    for i in range(4):
        env.agent.logbook.add(sid, T0 + i, "warn" if i == 1 else "info", "agent" if i == 0 else "console", f"l{i}")
    v2 = await get(env, f"/v2/sandboxes/{sid}/logs")
    assert v2.status_code == 200, v2.text
    assert v2.json()["logs"][0] == {
        "timestamp": "2023-11-14T22:13:20Z",
        "level": "info",
        "message": "l0",
        "fields": {"source": "agent", "offset": "0"},
    }
    later = (await get(env, f"/v2/sandboxes/{sid}/logs", cursor=int((T0 + 2) * 1000))).json()["logs"]
    assert [e["message"] for e in later] == ["l2", "l3"]
    back = await get(env, f"/v2/sandboxes/{sid}/logs", cursor=int((T0 + 2) * 1000), direction="backward", limit=2)
    assert [e["message"] for e in back.json()["logs"]] == ["l2", "l1"]
    warn = (await get(env, f"/v2/sandboxes/{sid}/logs", level="warn", search="l")).json()["logs"]
    assert [e["message"] for e in warn] == ["l1"]
    for params in ({"limit": 1001}, {"level": "loud"}, {"direction": "up"}, {"cursor": -1}):
        bad = await get(env, f"/v2/sandboxes/{sid}/logs", **params)
        assert bad.status_code == 400 and bad.json()["code"] == 400, params
    v1 = (await get(env, f"/sandboxes/{sid}/logs", start=int((T0 + 3) * 1000))).json()
    assert v1["logs"] == [{"timestamp": "2023-11-14T22:13:23Z", "line": "l3"}]
    assert [e["message"] for e in v1["logEntries"]] == ["l3"]
    assert (await get(env, "/v2/sandboxes/sb-nope/logs")).status_code == 404
