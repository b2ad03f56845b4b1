"""CLI: ``cryobox agent drain|undrain NAME`` call the control plane; ``cryobox agent`` alone still runs an agent
(and says what it needs when the options are missing)."""

from __future__ import annotations

from tests.support.cli import FakeApi, api, expect_json, ok, run

__all__ = ["api"]  # the fixture, bound here

REPORT = {
    "agent": "a0",
    "status": "draining",
    "count": 2,
    "drained": [{"id": "sb-1", "seconds": 3.25, "already": False}, {"id": "sb-2", "seconds": 0.0, "already": True}],
    "skipped": [{"id": "sb-3", "status": "lost"}],
    "errors": [],
    "seconds": 3.4,
}


def test_drain_json(api: FakeApi) -> None:
    api.on("POST", "/v1/agents/a0/drain", ok(200, REPORT))
    assert expect_json(run("agent", "drain", "a0", "--json")) == REPORT
    (request,) = api.requests
    assert request.headers["Authorization"] == "Bearer cli-key" and request.content == b""


def test_drain_table_and_exit_code_when_some_failed(api: FakeApi) -> None:
    failed = {**REPORT, "errors": [{"id": "sb-4", "code": "store_error", "error": "the store went away"}]}
    api.on("POST", "/v1/agents/a0/drain", ok(200, failed))
    result = run("agent", "drain", "a0")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "sb-1" in result.stdout and "3.2" in result.stdout and "already stored" in result.stdout
    assert "skipped sb-3 (lost)" in result.stderr and "sb-4 not drained" in result.stderr
    assert api.calls() == [("POST", "/v1/agents/a0/drain")]


def test_drain_of_an_unknown_agent_fails_with_its_error(api: FakeApi) -> None:
    result = run("agent", "drain", "nobody")
    assert result.exit_code == 2 and "not_found" in result.stderr


def test_undrain(api: FakeApi) -> None:
    api.on("POST", "/v1/agents/a0/undrain", ok(200, {"name": "a0", "status": "up"}))
    assert expect_json(run("agent", "undrain", "a0", "--json")) == {"name": "a0", "status": "up"}


def test_running_an_agent_still_needs_its_options(api: FakeApi) -> None:
    result = run("agent", "--control", "http://ctl")
    assert result.exit_code == 2 and "--listen, --control and --data-dir are required" in result.stderr
    assert api.requests == []
    helped = run("agent", "--help")
    assert helped.exit_code == 0 and "--listen" in helped.stdout and "drain" in helped.stdout
