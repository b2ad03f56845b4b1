"""CLI: ``cryobox volume ...`` in-process through the real SDK over a mocked transport (``tests/support/cli.py``)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.cli import FakeApi, api, expect_json, ok, run
from tests.support.sdk import error_response

__all__ = ["api"]  # the fixture, bound here
VOLUME: dict[str, Any] = {
    "id": "vol-0123456789ab",
    "name": "data",
    "size_mb": 1024,
    "size_bytes": 1 << 30,
    "used_bytes": 4 << 20,
    "filesystem": "ext4",
    "status": "ready",
    "host": "h1",
    "attached_to": [{"sandbox_id": "sbx_1", "path": "/data", "read_only": False}],
    "created_at": "2024-05-01T12:00:00Z",
}


def test_volume_create_list_get_resize_rm(api: FakeApi) -> None:
    api.on("POST", "/v1/volumes", ok(201, VOLUME))
    api.on("GET", "/v1/volumes", ok(200, {"items": [VOLUME]}))
    api.on("GET", "/v1/volumes/data", ok(200, VOLUME))
    api.on("PATCH", "/v1/volumes/data", ok(200, {**VOLUME, "size_mb": 2048, "size_bytes": 2 << 30}))
    api.on("DELETE", "/v1/volumes/data", httpx.Response(204))
    made = run("volume", "create", "data", "--size-mb", "1024")
    assert made.exit_code == 0 and made.stdout.strip() == "vol-0123456789ab", made.stderr
    assert json.loads(api.requests[0].content) == {"name": "data", "size_mb": 1024}
    listed = run("volume", "list")
    assert "data" in listed.stdout and "sbx_1:/data" in listed.stdout
    assert expect_json(run("volume", "get", "data", "--json"))["attached_to"][0]["sandbox_id"] == "sbx_1"
    assert run("volume", "resize", "data", "--size-mb", "2048").stdout.strip() == "data: 2048 MiB"
    assert expect_json(run("volume", "rm", "data", "--json")) == {"deleted": ["data"]}


def test_volume_rm_while_attached_exits_with_the_servers_message(api: FakeApi) -> None:
    api.on("DELETE", "/v1/volumes/data", error_response(409, "wrong_state", "volume vol-1 is attached to sbx_1"))
    result = run("volume", "rm", "data")
    assert result.exit_code == 2 and "attached" in result.stderr
