"""CLI: ``cryobox sandbox lifecycle`` and the timeout options of ``cryobox sandbox create``, in-process through
the real SDK over a mocked transport (``tests/support/cli.py``)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.cli import FakeApi, api, expect_json, ok, run
from tests.support.sdk import INFO, LIFECYCLE

__all__ = ["api"]  # the fixture, bound here
SBX_PATH = "/v1/sandboxes/sbx_0123"


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content)


def test_create_sends_the_timeout_action_and_auto_wake(api: FakeApi) -> None:
    api.on("POST", "/v1/sandboxes", ok(201, {**INFO, "on_timeout": "hibernate", "auto_wake": False}))
    result = run("sandbox", "create", "--on-timeout", "hibernate", "--no-auto-wake", "--ttl", "300")
    assert result.exit_code == 0, result.stderr
    body = body_of(api.requests[0])
    assert (body["on_timeout"], body["auto_wake"], body["ttl_seconds"]) == ("hibernate", False, 300)
    run("sandbox", "create")
    assert "on_timeout" not in body_of(api.requests[1]) and "auto_wake" not in body_of(api.requests[1])
    refused = run("sandbox", "create", "--on-timeout", "pause")
    assert refused.exit_code == 2 and len(api.requests) == 2  # nothing sent


def test_lifecycle_shows_and_changes_the_timeout_action(api: FakeApi) -> None:
    hibernated = {
        **LIFECYCLE,
        "on_timeout": "hibernate",
        "auto_wake": False,
        "hibernated_at": "2024-05-02T00:00:00Z",
        "retained_until": "2024-06-01T00:00:00Z",
    }
    api.on("GET", SBX_PATH, ok(200, INFO))
    api.on("GET", f"{SBX_PATH}/lifecycle", ok(200, hibernated))
    api.on("PATCH", f"{SBX_PATH}/lifecycle", ok(200, hibernated))
    shown = run("sandbox", "lifecycle", "sbx_0123")
    assert shown.exit_code == 0, shown.stderr
    assert "hibernate" in shown.stdout and "2024-06-01T00:00:00Z" in shown.stdout and "resume it" in shown.stdout
    assert not [r for r in api.requests if r.method == "PATCH"]
    changed = expect_json(run("sandbox", "lifecycle", "sbx_0123", "--no-auto-wake", "--json"))
    assert changed["retained_until"] == "2024-06-01T00:00:00Z"
    [patch] = [r for r in api.requests if r.method == "PATCH"]
    assert body_of(patch) == {"on_timeout": "hibernate", "auto_wake": False}  # the action kept as it was
