"""CLI: ``cryobox sandbox network`` (show, replace), ``cryobox sandbox egress`` and ``sandbox create``'s policy
options, in-process through the real SDK against a fake API (requests and output checked end to end)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.cli import FakeApi, api, expect_json, ok, run
from tests.support.sdk import INFO, error_response

__all__ = ["api"]  # the fixture, bound here

SBX = "/v1/sandboxes/sbx_0123"
DEFAULTS: dict[str, Any] = {
    "default": "deny",
    "allow": [],
    "deny": [],
    "ports": [],
    "public_traffic": True,
    "mask_request_host": None,
}
POLICY: dict[str, Any] = {
    **DEFAULTS,
    "allow": ["10.1.0.0/16", "*.example.org"],
    "deny": ["evil.example.org"],
    "ports": [80, 443],
    "public_traffic": False,
    "mask_request_host": "localhost:${PORT}",
}
LOG: dict[str, Any] = {
    "items": [
        {
            "time": 1714564800.25,
            "name": "api.example.com",
            "ip": "151.101.0.223",
            "port": 443,
            "allowed": True,
            "reason": "allow-name",
            "bytes_out": 517,
            "bytes_in": 4096,
            "error": None,
        },
        {
            "time": 1714564801.5,
            "name": "[red]spoof[/red].example.net",
            "ip": None,
            "port": 53,
            "allowed": False,
            "reason": "dns",
            "bytes_out": 0,
            "bytes_in": 0,
            "error": None,
        },
    ],
    "dropped": 3,
}


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content)


def with_sandbox(api: FakeApi) -> None:
    api.on("GET", SBX, ok(200, INFO))


# --- network: show ---------------------------------------------------------------------------------------------


def test_network_prints_the_policy(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("GET", f"{SBX}/network", ok(200, POLICY))
    result = run("sandbox", "network", "sbx_0123")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "default            deny",
        "allow              10.1.0.0/16 *.example.org",
        "deny               evil.example.org",
        "ports              80 443",
        "public traffic     no (the traffic token is needed)",
        "mask request host  localhost:${PORT}",
    ]
    assert api.calls() == [("GET", SBX), ("GET", f"{SBX}/network")]


def test_network_prints_defaults_and_json(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("GET", f"{SBX}/network", ok(200, DEFAULTS))
    result = run("sandbox", "network", "sbx_0123")
    assert result.stdout.splitlines()[1:4] == ["allow              -", "deny               -", "ports              any"]
    assert expect_json(run("sandbox", "network", "sbx_0123", "--json")) == DEFAULTS
    assert [r.method for r in api.requests] == ["GET"] * 4  # nothing but reads


def test_network_unknown_sandbox_exits_2(api: FakeApi) -> None:
    result = run("sandbox", "network", "sbx_gone")
    assert result.exit_code == 2
    assert "not_found" in result.stderr
    assert result.stdout == ""


# --- network: replace ------------------------------------------------------------------------------------------


def test_network_options_replace_the_whole_policy(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("PUT", f"{SBX}/network", ok(200, {**INFO, "network": POLICY}))
    result = run(
        "sandbox",
        "network",
        "sbx_0123",
        "--allow",
        "10.1.0.0/16",
        "--allow",
        "*.Example.org",
        "--deny",
        "evil.example.org",
        "--port",
        "443",
        "--port",
        "80",
        "--no-public-traffic",
        "--mask-host",
        "localhost:${PORT}",
    )
    assert result.exit_code == 0, result.stderr
    put = api.requests[-1]
    assert (put.method, put.url.path) == ("PUT", f"{SBX}/network")
    assert body_of(put) == POLICY  # whole, normalized: lower-case names, sorted ports
    assert "sbx_0123: network policy replaced" in result.stderr
    assert result.stdout.splitlines()[0] == "default            deny"


def test_network_one_option_resets_the_others(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("PUT", f"{SBX}/network", ok(200, {**INFO, "network": {**DEFAULTS, "default": "allow"}}))
    assert expect_json(run("sandbox", "network", "sbx_0123", "--default", "allow", "--json")) == {
        **DEFAULTS,
        "default": "allow",
    }
    assert body_of(api.requests[-1]) == {**DEFAULTS, "default": "allow"}


def test_network_bad_rule_is_refused_before_sending(api: FakeApi) -> None:
    with_sandbox(api)
    result = run("sandbox", "network", "sbx_0123", "--allow", "2001:db8::/32")
    assert result.exit_code == 2
    assert "invalid_argument" in result.stderr and "network.allow" in result.stderr
    assert [r.method for r in api.requests] == ["GET"]


def test_network_server_refusal_shows_its_message(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("PUT", f"{SBX}/network", error_response(400, "invalid_argument", "network.allow.0: too many names"))
    result = run("sandbox", "network", "sbx_0123", "--allow", "example.org")
    assert result.exit_code == 2
    assert "error (invalid_argument): network.allow.0: too many names" in result.stderr
    assert "replaced" not in result.stderr


def test_network_help_says_it_replaces() -> None:
    result = run("sandbox", "network", "--help")
    assert result.exit_code == 0
    assert "REPLACE the whole policy" in result.stdout
    assert "reset to its default" in result.stdout


# --- egress ----------------------------------------------------------------------------------------------------


def test_egress_prints_a_table(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("GET", f"{SBX}/egress", ok(200, LOG))
    result = run("sandbox", "egress", "sbx_0123", "--limit", "2")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[1]
    assert [h for h in header.replace("┃", " ").split()] == [
        "time",
        "name",
        "ip",
        "port",
        "verdict",
        "reason",
        "out",
        "in",
        "error",
    ]
    allowed = next(line for line in lines if "api.example.com" in line)
    assert allowed.replace("│", " ").split() == [
        "2024-05-01",
        "12:00:00.250Z",
        "api.example.com",
        "151.101.0.223",
        "443",
        "allowed",
        "allow-name",
        "517",
        "4096",
    ]
    denied = next(line for line in lines if "spoof" in line)
    # a guest-chosen name is shown as it is, never read as markup
    assert denied.replace("│", " ").split()[2:8] == ["[red]spoof[/red].example.net", "-", "53", "denied", "dns", "0"]
    assert lines.index(allowed) < lines.index(denied)  # the log's order: oldest first
    assert "3 older decisions no longer kept" in result.stderr
    assert dict(api.requests[-1].url.params) == {"limit": "2"}


def test_egress_json_and_default_limit(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("GET", f"{SBX}/egress", ok(200, LOG))
    assert expect_json(run("sandbox", "egress", "sbx_0123", "--json")) == LOG
    assert dict(api.requests[-1].url.params) == {"limit": "100"}


def test_egress_empty_and_out_of_range(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("GET", f"{SBX}/egress", ok(200, {"items": [], "dropped": 0}))
    result = run("sandbox", "egress", "sbx_0123")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "sbx_0123: no egress decisions recorded" in result.stderr
    calls = len(api.requests)
    assert run("sandbox", "egress", "sbx_0123", "--limit", "1001").exit_code == 2
    assert len(api.requests) == calls


# --- create ----------------------------------------------------------------------------------------------------


def test_create_with_policy_options(api: FakeApi) -> None:
    api.on("POST", "/v1/sandboxes", ok(201, INFO))
    result = run("sandbox", "create", "--default", "allow", "--deny", "169.254.0.0/16", "--deny", "evil.example.org")
    assert result.exit_code == 0, result.stderr
    assert body_of(api.requests[0])["network"] == {
        **DEFAULTS,
        "default": "allow",
        "deny": ["169.254.0.0/16", "evil.example.org"],
    }


def test_create_without_policy_options_sends_no_network(api: FakeApi) -> None:
    api.on("POST", "/v1/sandboxes", ok(201, INFO))
    assert run("sandbox", "create").exit_code == 0
    assert "network" not in body_of(api.requests[0])
