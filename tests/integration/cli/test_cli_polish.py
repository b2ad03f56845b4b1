"""The CLI against a real ``cryobox serve``: ``cryobox top`` (``--once`` and ``--json``) shows a sandbox that was
just created with its state and the herd counters as numbers; ``snapshot publish`` / ``snapshot import`` move a
snapshot into the store and register it again (progress on stderr, stdout pure JSON); ``template create`` bakes a
custom template and reports when it is ready."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from cryobox import Sandbox
from cryobox.bench.server import ServeProcess
from cryobox.objstore.client import open_store
from tests.support.serve import Client, cli


@pytest.fixture
def running(client: Client) -> Iterator[dict[str, object]]:
    """A sandbox of ``base`` (deleted when the client closes, even if the test fails)."""
    yield client.create(ttl_seconds=600)


def test_top_once_and_json_show_the_sandbox_and_the_counters(
    server: ServeProcess, client: Client, running: dict[str, object]
) -> None:
    sandbox_id = str(running["id"])
    made = time.time()  # the create answered just before: the sandbox is at most this old when top reads it
    once = cli("top", "--once", env={**server.env(), "COLUMNS": "200"})
    assert once.returncode == 0, once.stderr
    row = next(line for line in once.stdout.splitlines() if sandbox_id in line)
    assert "running" in row and "base" in row
    assert "herd" in once.stdout and "faults" in once.stdout

    as_json = cli("top", "--json", env=server.env())
    assert as_json.returncode == 0, as_json.stderr
    frame = json.loads(as_json.stdout)
    (mine,) = [s for s in frame["sandboxes"] if s["id"] == sandbox_id]
    assert mine["state"] == "running" and mine["template"] == "base"
    assert 0 <= mine["age_s"] <= time.time() - made + 5 and 0 < mine["ttl_left_s"] <= 600
    assert mine["vcpus"] >= 1 and mine["memory_mb"] >= 256
    for key in ("faults", "chunk_fetches", "cache_hits", "store_gets", "creates"):
        assert isinstance(frame["counters"][key], float), key
    assert frame["counters"]["creates"] >= 1  # this test's create at least
    # an agent's capacity is what its last heartbeat (every 2 s) reported: it counts this sandbox within a few beats
    deadline = time.monotonic() + 10
    while not (frame["agents"] and frame["agents"][0]["capacity"]["sandboxes"] >= 1):
        assert time.monotonic() < deadline, frame["agents"]
        time.sleep(0.5)
        again = cli("top", "--json", env=server.env())
        assert again.returncode == 0, again.stderr
        frame = json.loads(again.stdout)


def test_snapshot_publish_then_import_after_rm(
    server: ServeProcess, client: Client, running: dict[str, object]
) -> None:
    snap = client.snapshot(str(running["id"]))
    snap_id = snap["id"]
    try:
        published = cli("snapshot", "publish", snap_id, "--json", env=server.env())
        assert published.returncode == 0, published.stderr
        assert json.loads(published.stdout)["key"] == f"snapshots/{snap_id}"  # stdout: only the JSON
        assert f"publishing {snap_id}: done in" in published.stderr
        assert client.call("GET", f"/v1/snapshots/{snap_id}")["location"] == "stored"

        # as if another host had published it: its objects in the store, no row here (rm takes both; put back)
        store = open_store(json.loads(published.stdout)["store"])
        objects = {key: store.get(key) for key in store.list(f"snapshots/{snap_id}")}
        assert f"snapshots/{snap_id}/manifest.json" in objects
        removed = cli("snapshot", "rm", snap_id, env=server.env())
        assert removed.returncode == 0, removed.stderr
        client.call("GET", f"/v1/snapshots/{snap_id}", 404)
        for key, data in objects.items():
            store.put(key, data)

        imported = cli("snapshot", "import", snap_id, "--json", env=server.env())
        assert imported.returncode == 0, imported.stderr
        assert json.loads(imported.stdout)["id"] == snap_id
        assert f"importing {snap_id}: done in" in imported.stderr
        again = client.call("GET", f"/v1/snapshots/{snap_id}")
        assert again["location"] == "stored" and again["template"] == "base"
    finally:
        client.http.delete(f"/v1/snapshots/{snap_id}")


@pytest.fixture
def template_name(server: ServeProcess) -> Iterator[str]:
    """A fresh custom template name; the template is deleted afterwards."""
    name = f"tpl-cli-{secrets.token_hex(3)}"
    yield name
    httpx.delete(f"{server.url}/v1/templates/{name}", headers={"Authorization": f"Bearer {server.api_key}"})


@pytest.mark.timeout(900)
def test_template_create_bakes_and_reports_ready(server: ServeProcess, template_name: str) -> None:
    name = template_name
    created = subprocess.run(
        [sys.executable, "-m", "cryobox.cli.main", "template", "create", name]
        + ["--warmup", "echo from-the-cli > /root/cli.txt", "--timeout", "800", "--json"],
        capture_output=True,
        text=True,
        timeout=850,
        env={**os.environ, **server.env()},
    )
    assert created.returncode == 0, created.stderr
    template = json.loads(created.stdout)
    assert template["name"] == name and template["status"] == "ready"
    assert f"template {name}: done in" in created.stderr
    # the SDK: it retries the 503 a create gets until the agent's heartbeat says it serves the new template
    with Sandbox.create(template=name, api_url=server.url, api_key=server.api_key) as sbx:
        assert sbx.exec("cat /root/cli.txt").stdout == "from-the-cli\n"
