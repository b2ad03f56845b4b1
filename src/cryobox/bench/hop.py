"""The price of the control plane → agent hop, measured A, B, A, B …: ``cryobox serve`` (the agent in process) and a
fleet of one ``cryobox agent`` (the agent over HTTP) run side by side and take turns, so that whatever else the
machine does in the meantime (a pool refilling, a noisy neighbour, the page cache) falls on both alike. A first
version measured all of one side and then the other, and reported the in-process path as the slower one (create
125 vs 81 ms p50): the noise of one period, not the hop. Each round alternates which side goes first.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import CryoboxError
from ..util.steps import read_server_timing

OPS = ("create_ms", "first_exec_ms", "exec_ms", "create_agent_ms", "exec_agent_ms")
"""Per side: the create call, create to its first exec answered, an exec; and of the create and the exec, the
control plane's ``agent`` step as its ``Server-Timing`` gives it (the call to the agent, in process or over HTTP:
the hop without the registry steps' spread, which both sides share)."""
HOP_SETTLE_S = 2.0
"""The pause after each create's delete, before the next create (either side's). The create takes a pool VM, whose
replacement starts 0.25 s later and takes ~1.2 s to restore and warm under TCG; with 1 s the next create met the
other side's refill, and a side's create p50 spread 5-6 ms (sd) against 2.4-3.7 ms with 2 s (a scratch run of 30
each, 2026-12-07)."""


@dataclass(frozen=True)
class Side:
    name: str
    url: str
    api_key: str


def turns(i: int, sides: Sequence[Side]) -> list[Side]:
    """Round ``i``'s order: as given on even rounds, reversed on odd ones (A B, B A, A B …)."""
    return list(sides) if i % 2 == 0 else list(reversed(sides))


def checked(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON body of a successful API answer (``{}`` when it has none); a failure raises naming ``what``."""
    if response.status_code >= 300:
        raise CryoboxError(f"{what} failed: {response.status_code} {response.text[:300]}")
    if response.status_code == 204 or not response.content:
        return {}
    body: dict[str, Any] = response.json()
    return body


def exec_ok(client: httpx.Client, sandbox_id: str, cmd: str) -> httpx.Response:
    """``cmd`` run in the sandbox (its answer); anything but exit code 0 raises."""
    response = client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd, "timeout_seconds": 120})
    body = checked(response, "exec")
    if body.get("exit_code") != 0:
        raise CryoboxError(f"exec {cmd!r} exited {body.get('exit_code')}: {body.get('stderr', '')[:300]}")
    return response


def step_ms(response: httpx.Response, name: str) -> float | None:
    """Step ``name``'s duration in the answer's ``Server-Timing`` (``name;dur=ms, ...``), if it names one."""
    return read_server_timing(response.headers.get("server-timing", "")).get(name)


def _create(client: httpx.Client, template: str) -> tuple[str, float, float, float | None]:
    """A sandbox: its id, the create call's ms, the ms to its first exec answered, its ``agent`` step."""
    t0 = time.monotonic()
    response = client.post("/v1/sandboxes", json={"template": template, "ttl_seconds": 600})
    t1 = time.monotonic()
    sandbox = checked(response, "create")
    exec_ok(client, sandbox["id"], "true")
    return str(sandbox["id"]), (t1 - t0) * 1000, (time.monotonic() - t0) * 1000, step_ms(response, "agent")


def measure_hop(sides: Sequence[Side], template: str, k: int, settle_s: float) -> dict[str, dict[str, list[float]]]:
    """Per side, ``k`` creates (call, and to the first exec answered) and ``k`` execs of ``true`` on one sandbox,
    the sides taking turns. A first round per side warms up and is not counted; after each create the sandbox is
    deleted and ``settle_s`` passes before the next create, either side's (the pool refills, as for a caller pausing
    between creates)."""
    out: dict[str, dict[str, list[float]]] = {side.name: {op: [] for op in OPS} for side in sides}
    clients = {
        side.name: httpx.Client(
            base_url=side.url, headers={"Authorization": f"Bearer {side.api_key}"}, timeout=900, trust_env=False
        )
        for side in sides
    }
    kept: dict[str, str] = {}
    try:
        for i in range(k + 1):
            for side in turns(i, sides):
                client = clients[side.name]
                sandbox_id, call_ms, first_ms, agent_ms = _create(client, template)
                if i:
                    out[side.name]["create_ms"].append(call_ms)
                    out[side.name]["first_exec_ms"].append(first_ms)
                    if agent_ms is not None:
                        out[side.name]["create_agent_ms"].append(agent_ms)
                if i < k:
                    client.delete(f"/v1/sandboxes/{sandbox_id}")
                else:
                    kept[side.name] = sandbox_id  # the exec phase's sandbox
                # after every create, not every round: the second create of a round met the first side's pool
                # refilling (a QEMU spawned and warmed on the same 2 cores), and each side's samples alternated
                time.sleep(settle_s)
        for i in range(k):
            for side in turns(i, sides):
                t0 = time.monotonic()
                response = exec_ok(clients[side.name], kept[side.name], "true")
                out[side.name]["exec_ms"].append((time.monotonic() - t0) * 1000)
                agent_ms = step_ms(response, "agent")
                if agent_ms is not None:
                    out[side.name]["exec_agent_ms"].append(agent_ms)
    finally:
        for name, sandbox_id in kept.items():
            try:
                clients[name].delete(f"/v1/sandboxes/{sandbox_id}")
            except httpx.HTTPError:
                pass
        for client in clients.values():
            client.close()
    return out


def by_side(samples: Mapping[str, Mapping[str, list[float]]], name: str) -> dict[str, list[float]]:
    return {op: list(values) for op, values in samples.get(name, {}).items()}
