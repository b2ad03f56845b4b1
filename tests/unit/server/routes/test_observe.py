"""``/v1/sandboxes/{id}/metrics`` and ``/logs`` over a fake agent: what the agent keeps, in the public shape, with
the query passed on (and bad queries refused before the agent); another workspace's sandbox is 404; a hibernated
sandbox whose agent no longer holds it (or is gone) has an empty history; neither read is activity."""

from __future__ import annotations

from cryobox.agentapi.models_obs import MetricSample
from cryobox.errors import HostUnavailable
from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures


def sample(t: float) -> MetricSample:
    return MetricSample(
        timestamp=t, cpu_count=1, cpu_pct=50.0, memory_bytes=3 << 20, mem_total=512 << 20, mem_used=64 << 20
    )


async def test_metrics_in_a_time_range(env: Env) -> None:
    sid = await env.made()
    env.agent.samples[sid] = [sample(100.0), sample(105.0), sample(110.0)]
    touched = env.calls("touch")
    got = await env.client.get(f"/v1/sandboxes/{sid}/metrics", params={"start": 101, "end": 110})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["sandbox_id"] == sid and body["interval_seconds"] == 5.0 and body["dropped"] == 0
    assert [s["timestamp"] for s in body["samples"]] == [105.0, 110.0]
    assert body["samples"][0]["cpu_pct"] == 50.0 and body["samples"][0]["guest_view"] is True
    everything = (await env.client.get(f"/v1/sandboxes/{sid}/metrics")).json()
    assert len(everything["samples"]) == 3
    before = env.calls("sandbox_metrics")
    bad = await env.client.get(f"/v1/sandboxes/{sid}/metrics", params={"start": 9, "end": 1})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"
    assert env.calls("sandbox_metrics") == before and env.calls("touch") == touched


async def test_logs_page_by_page(env: Env) -> None:
    sid = await env.made()
    for i in range(5):
        env.agent.logbook.add(sid, 200.0 + i, "error" if i == 4 else "info", "console", f"line {i}")
    first = (await env.client.get(f"/v1/sandboxes/{sid}/logs", params={"limit": 3})).json()
    assert [e["message"] for e in first["logs"]] == ["line 0", "line 1", "line 2"]
    assert first["next_offset"] == 3 and first["logs"][0] == {
        "offset": 0,
        "timestamp": 200.0,
        "level": "info",
        "source": "console",
        "message": "line 0",
    }
    rest = (await env.client.get(f"/v1/sandboxes/{sid}/logs", params={"offset": first["next_offset"]})).json()
    assert [e["offset"] for e in rest["logs"]] == [3, 4] and rest["next_offset"] == 5
    newest = (await env.client.get(f"/v1/sandboxes/{sid}/logs", params={"direction": "backward", "limit": 1})).json()
    assert [e["message"] for e in newest["logs"]] == ["line 4"]
    errors = (await env.client.get(f"/v1/sandboxes/{sid}/logs", params={"level": "error", "search": "4"})).json()
    assert [e["offset"] for e in errors["logs"]] == [4]
    for params in ({"limit": 1001}, {"level": "loud"}, {"direction": "sideways"}, {"search": "x" * 300}):
        bad = await env.client.get(f"/v1/sandboxes/{sid}/logs", params=params)
        assert bad.status_code == 400, params


async def test_other_workspaces_and_absent_histories(env: Env) -> None:
    sid = await env.made()
    other = env.registry.ensure_workspace("beta").id
    _, key = env.registry.create_key(other)
    foreign = await env.client.get(f"/v1/sandboxes/{sid}/metrics", headers={"Authorization": f"Bearer {key}"})
    assert foreign.status_code == 404
    missing = await env.client.get("/v1/sandboxes/sb-nope/logs")
    assert missing.status_code == 404
    env.agent.fail_next["sandbox_metrics"] = HostUnavailable("agent a is down")
    assert (await env.client.get(f"/v1/sandboxes/{sid}/metrics")).status_code == 503
    assert (await env.client.post(f"/v1/sandboxes/{sid}/hibernate")).status_code == 200
    env.agent.fail_next["sandbox_metrics"] = HostUnavailable("agent a is down")
    quiet = await env.client.get(f"/v1/sandboxes/{sid}/metrics")
    assert quiet.status_code == 200 and quiet.json()["samples"] == []
    env.agent.sandboxes.pop(sid)  # its hibernation moved away
    logs = await env.client.get(f"/v1/sandboxes/{sid}/logs")
    assert logs.status_code == 200 and logs.json()["logs"] == []
    assert env.agent.sandboxes.get(sid) is None  # nothing woke it
