"""The console's back end against a real ``cryobox serve``: a cookie login drives the API (with the CSRF
header), the SSE stream lists the new sandbox, a bisect job on its snapshot counts 4/4, exec history, kill,
logout."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from cryobox.bench.server import ServeProcess

COMMAND = "test -f /tmp/never"


@dataclass
class Browser:
    http: httpx.Client
    """Keeps the cookies the server sets; no key of its own."""
    made: list[str] = field(default_factory=list)
    """Paths to DELETE afterwards (with the key), last first."""


@pytest.fixture
def browser(server: ServeProcess) -> Iterator[Browser]:
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        made = Browser(http)
        try:
            yield made
        finally:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.api_key}"}) as admin:
                for path in reversed(made.made):
                    admin.delete(path)


def first_sandboxes_event_with(http: httpx.Client, sandbox_id: str, timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    event = ""
    with http.stream("GET", "/ui/api/events", timeout=httpx.Timeout(10.0)) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "sandboxes":
                ids = [s["id"] for s in json.loads(line[6:])["sandboxes"]]
                if sandbox_id in ids:
                    return ids
            assert time.monotonic() < deadline, "no sandboxes event listed the new sandbox"
    raise AssertionError("the event stream ended")


def test_a_cookie_session_drives_sandboxes_events_and_a_bisect_job(server: ServeProcess, browser: Browser) -> None:
    made, http = browser.made, browser.http
    login = http.post("/ui/login", json={"api_key": server.api_key})
    assert login.status_code == 200, login.text
    csrf = {"X-CSRF-Token": login.json()["csrf_token"]}
    assert server.api_key not in login.headers["set-cookie"]

    assert http.post("/v1/sandboxes", json={"template": "base"}).status_code == 403  # no CSRF header
    created = http.post("/v1/sandboxes", json={"template": "base", "ttl_seconds": 600}, headers=csrf)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    made.append(f"/v1/sandboxes/{sandbox_id}")

    assert sandbox_id in first_sandboxes_event_with(http, sandbox_id)

    ran = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "echo console"}, headers=csrf)
    assert ran.status_code == 200 and ran.json()["stdout"] == "console\n"
    execs = http.get(f"/ui/api/sandboxes/{sandbox_id}/execs").json()["execs"]
    assert [(e["command"], e["exit_code"], e["stdout_tail"]) for e in execs] == [("echo console", 0, "console\n")]

    snap = http.post(f"/v1/sandboxes/{sandbox_id}/snapshots", json={}, headers=csrf)
    assert snap.status_code == 201, snap.text
    snapshot_id = snap.json()["id"]
    made.insert(0, f"/v1/snapshots/{snapshot_id}")  # deleted after the sandbox

    started = http.post(
        f"/v1/snapshots/{snapshot_id}/bisect",
        json={"command": COMMAND, "count": 4, "timeout_seconds": 60},
        headers=csrf,
    )
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    deadline = time.monotonic() + 300
    while (job := http.get(f"/v1/bisects/{job_id}").json())["state"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(1.0)
    assert job["state"] == "done", job
    assert (job["count"], job["reproduced"], job["passed"], job["errors"], job["ratio"]) == (4, 4, 0, 0, 1.0)
    assert len(job["result"]["children"]) == 4 and all(c["exit_code"] == 1 for c in job["result"]["children"])

    leftovers = http.get("/v1/sandboxes", params={"metadata.cryobox.bisect_job": job_id}).json()["items"]
    assert leftovers == []  # the temporary parent and its children are gone
    assert http.get(f"/v1/sandboxes/{sandbox_id}").json()["status"] == "running"

    assert http.delete(f"/v1/sandboxes/{sandbox_id}", headers=csrf).status_code == 204
    assert http.get(f"/v1/sandboxes/{sandbox_id}").status_code == 404
    assert http.post("/ui/logout", headers=csrf).status_code == 204
    assert http.get("/v1/sandboxes").status_code == 401
