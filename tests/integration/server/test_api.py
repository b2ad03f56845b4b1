"""The public API as a product: auth and workspaces, lifecycle and TTL, filters, limits, metrics, OpenAPI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cryobox import InvalidArgument, NotFound, Sandbox, Unauthorized
from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.serve import Api


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cryobox.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def _new_key(server: ServeProcess, workspace: str) -> str:
    done = _cli("keys", "create", "--workspace", workspace, "--data-dir", str(server.data_dir), "--json")
    assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


def test_missing_or_bad_key_is_401(server: ServeProcess) -> None:
    assert httpx.get(f"{server.url}/v1/sandboxes").status_code == 401
    response = httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    body = response.json()
    assert body["code"] == "unauthorized" and body["error"]
    with pytest.raises(Unauthorized):
        Sandbox.list(api_url=server.url, api_key="cbx_wrong")


def test_workspaces_do_not_see_each_other(server: ServeProcess, sandbox: Sandbox) -> None:
    other = _new_key(server, "other-team")
    other_api = Api(api_url=server.url, api_key=other)
    assert sandbox.id not in {s.id for s in Sandbox.list(**other_api)}
    with pytest.raises(NotFound):
        Sandbox.connect(sandbox.id, **other_api)
    for method, path in [("POST", "/exec"), ("GET", "/fs?path=/etc/hostname"), ("DELETE", ""), ("GET", "/lifecycle")]:
        response = httpx.request(
            method,
            f"{server.url}/v1/sandboxes/{sandbox.id}{path}",
            headers={"Authorization": f"Bearer {other}"},
            json={"cmd": "true"},
        )
        assert response.status_code == 404, (method, path, response.text)
    assert sandbox.exec("echo still-mine").stdout == "still-mine\n"


def test_revoked_key_is_refused(server: ServeProcess) -> None:
    key = _new_key(server, "revokers")
    assert httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    listed = json.loads(_cli("keys", "list", "--data-dir", str(server.data_dir), "--json").stdout)
    key_id = next(k["id"] for k in listed if k["workspace"] == "revokers")
    assert key not in json.dumps(listed), "key listing must not reveal secrets"
    assert _cli("keys", "revoke", key_id, "--data-dir", str(server.data_dir)).returncode == 0
    # the server caches key lookups for at most 5 s (CRYOBOX_KEY_CACHE_S): refused within that, then for good
    deadline = time.monotonic() + 10
    status = 200
    while status != 401 and time.monotonic() < deadline:
        status = httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": f"Bearer {key}"}).status_code
        time.sleep(0.2)
    assert status == 401
    assert httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_bad_input_is_400_and_creates_nothing(server: ServeProcess, api: Api) -> None:
    before = {s.id for s in Sandbox.list(**api)}
    headers = {"Authorization": f"Bearer {server.api_key}"}
    for body in (
        {"template": "base", "ttl_seconds": -5},
        {"template": "base", "metadata": {"k": 1}},
        {"template": ""},
        [1, 2],
    ):
        response = httpx.post(f"{server.url}/v1/sandboxes", json=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_argument"
    response = httpx.post(f"{server.url}/v1/sandboxes", content=b"{not json", headers=headers)
    assert response.status_code == 400
    assert httpx.post(f"{server.url}/v1/sandboxes", json={"template": "nope"}, headers=headers).status_code == 404
    with pytest.raises(InvalidArgument):
        Sandbox.create(template="base", ttl_seconds=0, **api)
    assert {s.id for s in Sandbox.list(**api)} == before


def test_list_filters_by_metadata_and_status(api: Api) -> None:
    with (
        Sandbox.create(template="base", metadata={"job": "f1", "team": "a"}, **api) as one,
        Sandbox.create(template="base", metadata={"job": "f2", "team": "a"}, **api) as two,
    ):
        team = {s.id for s in Sandbox.list(metadata={"team": "a"}, **api)}
        assert {one.id, two.id} <= team
        assert [s.id for s in Sandbox.list(metadata={"job": "f2"}, **api)] == [two.id]
        running = {s.id for s in Sandbox.list(status="running", **api)}
        assert {one.id, two.id} <= running
        assert not {one.id, two.id} & {s.id for s in Sandbox.list(status="paused", **api)}


def test_lifecycle_get_and_patch(sandbox: Sandbox) -> None:
    life = sandbox.lifecycle()
    assert life.ttl_seconds is None and life.persistent is False and life.expires_at is None
    time.sleep(1.0)
    idle = sandbox.lifecycle().idle_seconds  # reading the lifecycle is not activity: the idle clock runs on
    assert idle >= life.idle_seconds + 1.0
    life = sandbox.set_ttl(300)  # changing it is: the idle clock restarts
    assert life.ttl_seconds == 300 and life.expires_at is not None and life.idle_seconds < idle
    life = sandbox.set_persistent(True)
    assert life.persistent is True and life.expires_at is None
    assert sandbox.refresh().persistent is True


def test_oversized_body_is_413(server: ServeProcess, sandbox: Sandbox) -> None:
    response = httpx.post(
        f"{server.url}/v1/sandboxes/{sandbox.id}/exec",
        headers={"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"},
        content=b'{"cmd": "' + b"x" * (100 << 20) + b'"}',
    )
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


def test_metrics_count_creates_execs_and_requests(server: ServeProcess, sandbox: Sandbox) -> None:
    sandbox.exec("true")
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.api_key}"}).text
    assert 'cryobox_creates_total{boot_mode="restore",result="ok"}' in text
    assert "cryobox_create_duration_seconds_bucket" in text
    assert 'cryobox_exec_duration_seconds_count{result="ok"}' in text
    assert 'route="/v1/sandboxes/{sandbox_id}/exec"' in text
    assert "cryobox_admission_queue_depth" in text
    assert 'cryobox_sandboxes{state="running"}' in text


def test_openapi_document_is_served(server: ServeProcess) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    paths = doc["paths"]
    for path in (
        "/v1/sandboxes",
        "/v1/sandboxes/{sandbox_id}",
        "/v1/sandboxes/{sandbox_id}/exec",
        "/v1/sandboxes/{sandbox_id}/exec/stream",
        "/v1/sandboxes/{sandbox_id}/fs",
        "/v1/sandboxes/{sandbox_id}/fs/dir",
        "/v1/sandboxes/{sandbox_id}/fs/stat",
        "/v1/sandboxes/{sandbox_id}/lifecycle",
        "/v1/templates",
        "/v1/templates/build",
        "/v1/templates/{name}/builds/{build_id}/logs",
        "/v1/templates/{name}/builds/{build_id}/logs/stream",
        "/v1/info",
        "/healthz",
        "/metrics",
    ):
        assert path in paths, path
    assert "504" in paths["/v1/sandboxes/{sandbox_id}/exec"]["post"]["responses"]


def test_idle_ttl_reaper_deletes_idle_sandboxes(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path_factory.mktemp("ttl")
    args = ["--reap-interval", "0.5", "--templates", "base", "--net-pool", "2"]  # one template: a cheaper start-up
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=args) as srv:
        api = Api(api_url=srv.url, api_key=srv.api_key)
        idle = Sandbox.create(template="base", ttl_seconds=3, **api)
        busy = Sandbox.create(template="base", ttl_seconds=3, **api)
        try:
            for _ in range(5):  # requests keep `busy` alive: the TTL counts idle time
                time.sleep(1.0)
                busy.exec("true")
            last_request = time.monotonic()
            with pytest.raises(NotFound):
                idle.refresh()
            assert busy.refresh().status == "running"
            # now idle: reaped once its TTL has passed (a GET is not activity), at the next 0.5 s sweep
            while time.monotonic() - last_request < 10:
                try:
                    busy.refresh()
                except NotFound:
                    break
                time.sleep(0.2)
            assert time.monotonic() - last_request >= 3 - 0.2, "reaped before its TTL of idle time"
            with pytest.raises(NotFound):
                busy.refresh()
        finally:
            idle.close()
            busy.close()
