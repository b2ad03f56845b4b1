"""CLI: ``cryobox snapshot ...`` and the snapshot / fork / power commands of ``cryobox sandbox``.

The commands run in-process (typer's CliRunner) through the real SDK; every HTTP client they open gets an
httpx.MockTransport (``ClientConfig.client_options`` is patched), so requests and output are checked end to end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from cryobox.cli.snapshot_cmds import merge_labels
from tests.support.cli import FakeApi, api, expect_json, ok, run
from tests.support.sdk import INFO, SNAP, TREE, error_response

__all__ = ["api"]  # the fixture, bound here


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content)


SBX_PATH = "/v1/sandboxes/sbx_0123"


def with_sandbox(api: FakeApi, **info: Any) -> None:
    api.on("GET", SBX_PATH, ok(200, {**INFO, **info}))


# --- cryobox snapshot ------------------------------------------------------------------------------------------


def test_snapshot_list_json_with_filters(api: FakeApi) -> None:
    api.on("GET", "/v1/snapshots", ok(200, {"snapshots": [SNAP]}))
    result = run("snapshot", "list", "--sandbox", "sbx_0123", "--label", "step=3", "-l", "team=a", "--json")
    assert expect_json(result) == [SNAP]
    (request,) = api.requests
    assert dict(request.url.params) == {"sandbox_id": "sbx_0123", "label.step": "3", "label.team": "a"}
    assert request.headers["Authorization"] == "Bearer cli-key"


def test_snapshot_list_table(api: FakeApi) -> None:
    api.on("GET", "/v1/snapshots", ok(200, {"snapshots": [SNAP, {**SNAP, "id": "snp_0002", "retain": False}]}))
    result = run("snapshot", "list")
    assert result.exit_code == 0, result.stderr
    assert "snp_0001" in result.stdout and "snp_0002" in result.stdout
    assert "step=3" in result.stdout
    assert "120.6 KiB" in result.stdout
    assert "22.9 KiB" in result.stdout and "97.7 KiB" in result.stdout  # unique, shared
    assert "2024-05-01T12:30:00+00:00" in result.stdout
    assert api.requests[0].url.query == b""


def test_snapshot_list_table_shows_unique_and_shared_columns(api: FakeApi) -> None:
    sizes = {"size_bytes": 5 << 30, "unique_bytes": 3 << 20, "shared_bytes": 2 << 40}
    api.on("GET", "/v1/snapshots", ok(200, {"snapshots": [{**SNAP, **sizes}]}))
    result = run("snapshot", "list")
    assert result.exit_code == 0, result.stderr
    header, row = result.stdout.splitlines()[1], result.stdout.splitlines()[3]
    assert header.index("size") < header.index("unique") < header.index("shared") < header.index("created")
    assert row.index("5.0 GiB") < row.index("3.0 MiB") < row.index("2.0 TiB")


def test_snapshot_get(api: FakeApi) -> None:
    api.on("GET", "/v1/snapshots/snp_0001", ok(200, SNAP))
    assert expect_json(run("snapshot", "get", "snp_0001", "--json")) == SNAP
    result = run("snapshot", "get", "snp_0001")
    assert result.exit_code == 0
    assert "snp_0001" in result.stdout


def test_snapshot_get_not_found(api: FakeApi) -> None:
    result = run("snapshot", "get", "snp_gone")
    assert result.exit_code == 2
    assert "not_found" in result.stderr
    assert result.stdout == ""


def test_snapshot_rm(api: FakeApi) -> None:
    api.on("DELETE", "/v1/snapshots/snp_a", httpx.Response(204))
    api.on("DELETE", "/v1/snapshots/snp_b", httpx.Response(204))
    assert expect_json(run("snapshot", "rm", "snp_a", "snp_b", "--json")) == {"deleted": ["snp_a", "snp_b"]}
    result = run("snapshot", "rm", "snp_a")
    assert result.exit_code == 0
    assert "deleted snp_a" in result.stderr
    assert api.calls() == [
        ("DELETE", "/v1/snapshots/snp_a"),
        ("DELETE", "/v1/snapshots/snp_b"),
        ("DELETE", "/v1/snapshots/snp_a"),
    ]


def test_snapshot_rm_stops_at_the_first_error(api: FakeApi) -> None:
    api.on("DELETE", "/v1/snapshots/snp_b", httpx.Response(204))
    result = run("snapshot", "rm", "snp_gone", "snp_b")
    assert result.exit_code == 2
    assert "not_found" in result.stderr
    assert api.calls() == [("DELETE", "/v1/snapshots/snp_gone")]


def test_snapshot_label_merges_with_current_labels(api: FakeApi) -> None:
    api.on("GET", "/v1/snapshots/snp_0001", ok(200, {**SNAP, "labels": {"step": "3", "team": "a"}}))
    api.on("PATCH", "/v1/snapshots/snp_0001", lambda request: ok(200, {**SNAP, **body_of(request)}))
    out = expect_json(run("snapshot", "label", "snp_0001", "owner=me", "team=", "--retain", "--json"))
    assert out["labels"] == {"step": "3", "owner": "me"}
    assert api.calls() == [("GET", "/v1/snapshots/snp_0001"), ("PATCH", "/v1/snapshots/snp_0001")]
    assert body_of(api.requests[1]) == {"labels": {"step": "3", "owner": "me"}, "retain": True}


def test_snapshot_label_retain_only_does_not_touch_labels(api: FakeApi) -> None:
    api.on("PATCH", "/v1/snapshots/snp_0001", lambda request: ok(200, {**SNAP, **body_of(request)}))
    result = run("snapshot", "label", "snp_0001", "--no-retain")
    assert result.exit_code == 0, result.stderr
    assert api.calls() == [("PATCH", "/v1/snapshots/snp_0001")]
    assert body_of(api.requests[0]) == {"retain": False}


@pytest.mark.parametrize("args", [[], ["novalue"], ["=v"]])
def test_snapshot_label_usage_errors(api: FakeApi, args: list[str]) -> None:
    result = run("snapshot", "label", "snp_0001", *args)
    assert result.exit_code == 2
    assert api.requests == []


def test_snapshot_label_not_found(api: FakeApi) -> None:
    result = run("snapshot", "label", "snp_gone", "a=b")
    assert result.exit_code == 2
    assert "not_found" in result.stderr
    assert api.calls() == [("GET", "/v1/snapshots/snp_gone")]


@pytest.mark.parametrize(
    ("current", "changes", "merged"),
    [
        ({}, {"a": "1"}, {"a": "1"}),
        ({"a": "1", "b": "2"}, {"a": "", "c": "3"}, {"b": "2", "c": "3"}),
        ({"a": "1"}, {"missing": ""}, {"a": "1"}),
    ],
)
def test_merge_labels(current: Mapping[str, str], changes: Mapping[str, str], merged: dict[str, str]) -> None:
    assert merge_labels(dict(current), dict(changes)) == merged


# --- cryobox sandbox: create, kill ------------------------------------------------------------------------------


def test_sandbox_create_from_snapshot(api: FakeApi) -> None:
    api.on("POST", "/v1/sandboxes", ok(201, {**INFO, "from_snapshot": "snp_0001"}))
    result = run("sandbox", "create", "--from-snapshot", "snp_0001", "-m", "owner=cli")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "sbx_0123"
    body = body_of(api.requests[0])
    assert (body["from_snapshot"], body["metadata"]) == ("snp_0001", {"owner": "cli"})
    assert expect_json(run("sandbox", "create", "--json"))["from_snapshot"] == "snp_0001"
    assert "from_snapshot" not in body_of(api.requests[1])


def test_sandbox_kill_keep_snapshots(api: FakeApi) -> None:
    api.on("DELETE", SBX_PATH, httpx.Response(204))
    assert expect_json(run("sandbox", "kill", "sbx_0123", "--keep-snapshots", "--json")) == {"killed": ["sbx_0123"]}
    result = run("sandbox", "kill", "sbx_0123")
    assert result.exit_code == 0
    assert "killed sbx_0123" in result.stderr
    assert [dict(r.url.params) for r in api.requests] == [{"keep_snapshots": "true"}, {}]


def test_sandbox_kill_not_found(api: FakeApi) -> None:
    result = run("sandbox", "kill", "sbx_gone")
    assert result.exit_code == 2
    assert "not_found" in result.stderr


# --- cryobox sandbox: power state -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "reply", "status"),
    [
        ("pause", httpx.Response(204), "paused"),
        ("resume", httpx.Response(204), "running"),
        ("hibernate", ok(200, {"status": "hibernated"}), "hibernated"),
        ("wake", ok(200, {"status": "running"}), "running"),
    ],
)
def test_sandbox_power(api: FakeApi, action: str, reply: httpx.Response, status: str) -> None:
    with_sandbox(api)
    api.on("POST", f"{SBX_PATH}/{action}", reply)
    assert expect_json(run("sandbox", action, "sbx_0123", "--json")) == {"id": "sbx_0123", "status": status}
    result = run("sandbox", action, "sbx_0123")
    assert result.exit_code == 0
    assert f"sbx_0123: {status}" in result.stderr
    assert api.calls()[:2] == [("GET", SBX_PATH), ("POST", f"{SBX_PATH}/{action}")]


def test_sandbox_power_wrong_state(api: FakeApi) -> None:
    with_sandbox(api, status="stopped")
    api.on("POST", f"{SBX_PATH}/pause", error_response(409, "wrong_state", "sandbox is stopped"))
    result = run("sandbox", "pause", "sbx_0123")
    assert result.exit_code == 2
    assert "wrong_state" in result.stderr and "sandbox is stopped" in result.stderr


def test_sandbox_power_unknown_sandbox(api: FakeApi) -> None:
    result = run("sandbox", "hibernate", "sbx_gone")
    assert result.exit_code == 2
    assert "not_found" in result.stderr
    assert api.calls() == [("GET", "/v1/sandboxes/sbx_gone")]


# --- cryobox sandbox: snapshot, fork, fork-tree, promote --------------------------------------------------------


def test_sandbox_snapshot(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("POST", f"{SBX_PATH}/snapshots", ok(201, SNAP))
    args = ["sandbox", "snapshot", "sbx_0123", "--label", "step=3", "--retain", "--quiesce"]
    assert expect_json(run(*args, "--json")) == SNAP
    assert body_of(api.requests[1]) == {"labels": {"step": "3"}, "retain": True, "quiesce": True}
    result = run("sandbox", "snapshot", "sbx_0123")
    assert result.exit_code == 0
    assert result.stdout.strip() == "snp_0001"
    assert "123456 bytes (23456 unique, 100000 shared), paused 18 ms" in result.stderr
    assert body_of(api.requests[3]) == {"labels": {}, "retain": False, "quiesce": False}


def test_sandbox_snapshot_error(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("POST", f"{SBX_PATH}/snapshots", error_response(409, "wrong_state", "sandbox is hibernated"))
    result = run("sandbox", "snapshot", "sbx_0123")
    assert result.exit_code == 2
    assert "wrong_state" in result.stderr


def test_sandbox_fork(api: FakeApi) -> None:
    with_sandbox(api)
    child = {**INFO, "id": "sbx_child", "metadata": {"k": "v"}}
    api.on("POST", f"{SBX_PATH}/fork", ok(201, {"parent_id": "sbx_0123", "sandbox": child}))
    out = expect_json(run("sandbox", "fork", "sbx_0123", "-m", "k=v", "--json"))
    assert out == {"parent_id": "sbx_0123", "sandbox": child}
    assert body_of(api.requests[1]) == {"metadata": {"k": "v"}}
    result = run("sandbox", "fork", "sbx_0123")
    assert result.exit_code == 0
    assert result.stdout.strip() == "sbx_child"


def test_sandbox_fork_tree(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("POST", f"{SBX_PATH}/fork-tree", ok(201, {**TREE, "errors": []}))
    out = expect_json(run("sandbox", "fork-tree", "sbx_0123", "--count", "2", "-m", "run=1", "--json"))
    assert out == {**TREE, "errors": []}
    assert body_of(api.requests[1]) == {"count": 2, "metadata": {"run": "1"}}
    result = run("sandbox", "fork-tree", "sbx_0123")
    assert result.exit_code == 0
    assert "sbx_c1" in result.stdout and "sbx_c2" in result.stdout
    assert "tree tree_1 from snapshot snp_tree" in result.stderr


def test_sandbox_fork_tree_partial_failure_exits_1(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("POST", f"{SBX_PATH}/fork-tree", ok(201, TREE))
    assert expect_json(run("sandbox", "fork-tree", "sbx_0123", "-n", "3", "--json"), code=1) == TREE
    result = run("sandbox", "fork-tree", "sbx_0123", "-n", "3")
    assert result.exit_code == 1
    assert "child 2 failed" in result.stderr and "no capacity" in result.stderr


def test_sandbox_fork_tree_count_must_be_positive(api: FakeApi) -> None:
    result = run("sandbox", "fork-tree", "sbx_0123", "--count", "0")
    assert result.exit_code == 2
    assert api.requests == []


def test_sandbox_fork_tree_refused(api: FakeApi) -> None:
    with_sandbox(api)
    api.on("POST", f"{SBX_PATH}/fork-tree", error_response(400, "invalid_argument", "count must be 1-16"))
    result = run("sandbox", "fork-tree", "sbx_0123", "--count", "17")
    assert result.exit_code == 2
    assert "invalid_argument" in result.stderr


def test_sandbox_promote(api: FakeApi) -> None:
    with_sandbox(api)
    promoted = {"winner": "sbx_0123", "tree_id": "tree_1", "deleted": ["sbx_c2"], "failures": []}
    api.on("POST", f"{SBX_PATH}/promote", ok(200, promoted))
    assert expect_json(run("sandbox", "promote", "sbx_0123", "--tree", "tree_1", "--json")) == promoted
    assert body_of(api.requests[1]) == {"tree_id": "tree_1", "cleanup_siblings": True}
    result = run("sandbox", "promote", "sbx_0123", "--tree", "tree_1", "--keep-siblings")
    assert result.exit_code == 0
    assert "winner sbx_0123" in result.stderr
    assert body_of(api.requests[3]) == {"tree_id": "tree_1", "cleanup_siblings": False}


def test_sandbox_promote_failures_exit_1(api: FakeApi) -> None:
    with_sandbox(api)
    promoted = {"winner": "sbx_0123", "tree_id": "tree_1", "deleted": [], "failures": [{"id": "sbx_c2", "error": "x"}]}
    api.on("POST", f"{SBX_PATH}/promote", ok(200, promoted))
    result = run("sandbox", "promote", "sbx_0123", "--tree", "tree_1")
    assert result.exit_code == 1
    assert "could not delete sbx_c2" in result.stderr


def test_sandbox_promote_unknown_tree(api: FakeApi) -> None:
    with_sandbox(api)
    result = run("sandbox", "promote", "sbx_0123", "--tree", "tree_gone")
    assert result.exit_code == 2
    assert "not_found" in result.stderr
