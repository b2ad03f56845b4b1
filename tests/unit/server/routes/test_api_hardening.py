"""API hardening in-process: bounded metadata/env, the gate in the real app, single-use terminal tickets."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from cryobox.errors import NotFound
from cryobox.objstore.client import open_store
from cryobox.objstore.keys import snapshot_prefix
from cryobox.registry.rows import SnapshotRow
from cryobox.server.access.tickets import PtyTickets
from tests.support.app import Env, agent, env, quota, registry

__all__ = ["agent", "env", "quota", "registry"]  # fixtures


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {f"k{i}": "v" for i in range(65)}},
        {"metadata": {"k" * 129: "v"}},
        {"metadata": {"k": "v" * 1025}},
        {"env": {"A=B": "x"}},
        {"env": {"A": "nul\x00byte"}},
        {"env": {"A": "x" * 32769}},
        {"env": {f"V{i}": "x" for i in range(257)}},
    ],
)
async def test_oversized_or_malformed_metadata_and_env_are_refused_and_nothing_is_created(
    env: Env, body: dict[str, object]
) -> None:
    response = await env.create(**body)
    assert 400 <= response.status_code < 500 and response.status_code != 429, response.text
    assert env.calls("create") == 0 and env.rows() == 0


async def test_limits_that_fit_are_accepted(env: Env) -> None:
    sandbox_id = await env.made(metadata={f"k{i}": "v" * 1024 for i in range(64)}, env={"PATH": "/bin", "X": ""})
    assert sandbox_id


async def test_the_real_app_checks_the_key_before_reading_a_2_mib_body(env: Env) -> None:
    big = b'{"template": "base", "metadata": {"x": "' + b"y" * (2 << 20) + b'"}}'
    anonymous = httpx.AsyncClient(transport=env.client._transport, base_url="http://ctl")  # noqa: SLF001
    async with anonymous:
        response = await anonymous.post("/v1/sandboxes", content=big, headers={"content-type": "application/json"})
        assert response.status_code == 401
        assert (await anonymous.get("/v1/info")).status_code == 401
        assert (await anonymous.get("/metrics")).status_code == 401
        assert (await anonymous.get("/healthz")).status_code == 200
    too_big = await env.client.post("/v1/sandboxes", content=big, headers={"content-type": "application/json"})
    assert too_big.status_code == 413 and too_big.json()["code"] == "payload_too_large"
    assert env.calls("create") == 0


async def test_a_terminal_ticket_is_issued_only_for_a_visible_sandbox(env: Env) -> None:
    sandbox_id = await env.made()
    issued = await env.client.post(f"/v1/sandboxes/{sandbox_id}/pty/tickets")
    assert issued.status_code == 201, issued.text
    ticket = issued.json()["ticket"]
    assert ticket.startswith("pty_") and issued.json()["expires_in_s"] == 30
    assert (await env.client.post("/v1/sandboxes/sb-nope/pty/tickets")).status_code == 404


def test_tickets_are_single_use_bound_to_one_sandbox_and_expire() -> None:
    now = [100.0]
    tickets = PtyTickets(ttl_s=30, clock=lambda: now[0])
    one = tickets.issue("ws", "sb-1")
    assert tickets.redeem(one, "sb-1") == "ws"
    assert tickets.redeem(one, "sb-1") is None  # used up
    two = tickets.issue("ws", "sb-1")
    assert tickets.redeem(two, "sb-2") is None and tickets.redeem(two, "sb-1") is None  # wrong sandbox burns it
    three = tickets.issue("ws", "sb-1")
    now[0] += 31
    assert tickets.redeem(three, "sb-1") is None
    assert tickets.redeem("pty_forged", "sb-1") is None


async def test_importing_another_workspaces_snapshot_is_a_404_that_confirms_nothing(env: Env, tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    env.control.snapshots.objects = store
    other = env.registry.ensure_workspace("beta").id
    row = SnapshotRow(
        id="snap-theirs", workspace_id=other, template="base", path="", sandbox_id=None, parent_id=None,
        size_bytes=1, pause_ms=0.0, labels={}, retain=False, created_at=1.0, host="", location="stored",
    )  # fmt: skip
    env.registry.add_snapshot(row)
    store.put(f"{snapshot_prefix(row.id)}/manifest.json", json.dumps({"template": "base"}).encode())
    theirs = env.control.snapshots.import_published
    with pytest.raises(NotFound):
        await theirs("snap-theirs", env.ws, labels={}, retain=False)
    with pytest.raises(NotFound):  # exactly what an id that exists nowhere gives
        await theirs("snap-nowhere", env.ws, labels={}, retain=False)
    assert env.registry.get_snapshot("snap-theirs").workspace_id == other


async def test_a_field_cryobox_does_not_carry_out_is_a_400_naming_it(env: Env) -> None:
    """A field cryobox does not know (a typo, another service's) is refused by name, never parsed and dropped."""
    before = env.calls("create")
    for extra, named in (({"gpu": {"count": 1}}, "gpu"), ({"ttl": 5}, "ttl")):
        refused = await env.create(**extra)
        assert refused.status_code == 400 and named in refused.json()["error"], refused.text
    assert env.calls("create") == before and env.rows() == 0
    made = await env.create()
    sid = made.json()["id"]
    refused = await env.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true", "user": "root"})
    assert refused.status_code == 400 and "user" in refused.json()["error"], refused.text
