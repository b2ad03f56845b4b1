"""CLI: ``cryobox sandbox url`` (a signed file URL), in-process through the real SDK against a fake API."""

from __future__ import annotations

import json

import httpx

from tests.support.cli import FakeApi, api, expect_json, ok, run
from tests.support.sdk import INFO, error_response

__all__ = ["api"]  # the fixture, bound here

SBX = "/v1/sandboxes/sbx_0123"
SIGNED = {"url": "http://test/v1/sandboxes/sbx_0123/files/signed?path=%2Fa&expires=9&signature=s", "method": "PUT"}


def answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    if body.get("user") and body["operation"] != "write":
        return error_response(400, "invalid_argument", "user: only a write URL names a user")
    return ok(200, {**SIGNED, "method": "PUT" if body["operation"] == "write" else "GET", "expires_at": "T"})


def test_url_prints_the_signed_url_and_sends_the_options(api: FakeApi) -> None:
    api.on("GET", SBX, ok(200, INFO))
    api.on("POST", f"{SBX}/files/url", answer)
    result = run("sandbox", "url", "sbx_0123:/data/out.csv", "--write", "--expires-in", "60", "--user", "user")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == SIGNED["url"] and "PUT, until T" in result.stderr
    sent = json.loads(api.requests[-1].content)
    assert sent == {"path": "/data/out.csv", "operation": "write", "expires_in": 60, "user": "user"}
    read = expect_json(run("sandbox", "url", "sbx_0123:/data/out.csv", "--json"))
    assert read["method"] == "GET" and json.loads(api.requests[-1].content) == {
        "path": "/data/out.csv",
        "operation": "read",
    }


def test_url_refusals_exit_2_with_the_message_and_a_bad_target_sends_nothing(api: FakeApi) -> None:
    api.on("GET", SBX, ok(200, INFO))
    api.on("POST", f"{SBX}/files/url", answer)
    refused = run("sandbox", "url", "sbx_0123:/a", "--user", "root")
    assert refused.exit_code == 2 and "only a write URL names a user" in refused.stderr
    before = len(api.requests)
    bad = run("sandbox", "url", "sbx_0123:relative")
    assert bad.exit_code != 0 and "SANDBOX_ID:/absolute/guest/path" in bad.stderr
    assert len(api.requests) == before
