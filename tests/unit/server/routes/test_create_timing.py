"""A create's ``Server-Timing`` says where its time went, step by step: the control plane's own share
(``control``), each of its steps, and the agent's (``agent``: the restore); an exec's says ``control``, ``agent``
and ``guest`` (the command as the guest timed it)."""

from __future__ import annotations

import re

import pytest

from cryobox.util.steps import read_server_timing, server_timing, step
from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures

STEPS = ["control", "ttl", "source", "volumes", "admit", "reserve", "agent", "commit"]


def parse(header: str) -> dict[str, float]:
    found = {}
    for part in header.split(", "):
        match = re.fullmatch(r"([a-z]+);dur=(\d+\.\d\d)", part)
        assert match, header
        found[match[1]] = float(match[2])
    return found


async def test_a_create_reports_each_step(env: Env) -> None:
    made = await env.client.post("/v1/sandboxes", json={"template": "base"})
    assert made.status_code == 201, made.text
    timing = parse(made.headers["server-timing"])
    assert list(timing) == STEPS  # the answer is built from what the create did: no registry read ("view")
    assert all(ms >= 0 for ms in timing.values())


async def test_an_exec_reports_the_control_plane_the_agent_and_the_guest(env: Env) -> None:
    made = await env.client.post("/v1/sandboxes", json={"template": "base"})
    ran = await env.client.post(f"/v1/sandboxes/{made.json()['id']}/exec", json={"cmd": "true"})
    assert ran.status_code == 200, ran.text
    timing = parse(ran.headers["server-timing"])
    assert list(timing) == ["control", "agent", "guest"]
    assert timing["guest"] == pytest.approx(ran.json()["duration_ms"], abs=0.01)
    assert timing["agent"] >= 0 and timing["control"] >= 0


def test_steps_add_up_per_name_and_render_in_order() -> None:
    ticks = iter([0.0, 0.002, 0.010, 0.013, 0.020, 0.0205])
    timing: dict[str, float] = {}
    for name in ("a", "b", "a"):
        with step(timing, name, clock=lambda: next(ticks)):
            pass
    assert timing == pytest.approx({"a": 2.5, "b": 3.0})
    assert server_timing({"control": 1.234, **timing}) == "control;dur=1.23, a;dur=2.50, b;dur=3.00"
    assert read_server_timing(server_timing({"control": 1.234, **timing})) == {"control": 1.23, "a": 2.5, "b": 3.0}
    assert read_server_timing("agent;dur=x, guest, ;dur=1,restore;dur=8.4") == {"restore": 8.4}
    ran = []
    with step(None, "ignored"):  # no timing asked for: nothing recorded, the block still runs
        ran.append(True)
    assert ran == [True]
