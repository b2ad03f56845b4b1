"""Timeout actions through E2B's SDK, unchanged (``apps/e2b_timeouts_app.py``): ``lifecycle={"on_timeout":
"pause"}`` keeps a sandbox paused at its timeout (its file and background process there after ``connect``),
without it the sandbox is gone; ``auto_resume`` resumes one on a plain ``commands.run``; without it a paused
sandbox refuses commands until it is resumed; a paused sandbox forks and stays paused."""

from __future__ import annotations

from pathlib import Path

from cryobox.bench.server import ServeProcess
from tests.support.e2b import run_app_module
from tests.support.serve import Client


def test_e2b_sandboxes_pause_at_their_timeout_and_resume(e2b_python: Path, server: ServeProcess) -> None:
    report = run_app_module(e2b_python, server.url, server.api_key, server.data_dir, "e2b_timeouts_app")
    ids = report["ids"]
    assert report["lifecycle_info"] == {"on_timeout": "pause", "auto_resume": False}, report["lifecycle_info"]
    assert report["killed_state"].startswith("gone"), report["killed_state"]
    refusal = report["no_auto_resume"]
    assert refusal["refused"] is True and "does not wake on requests" in refusal["message"], refusal
    assert report["still_paused"] == "paused"
    connect = report["connect"]
    assert connect["out"] == "kept\nalive\n" and connect["state"] == "running", connect
    auto = report["auto_resume"]
    assert auto == {"out": "auto\n", "state": "running"}, auto
    fork = report["fork_paused"]
    assert fork == {"before": "paused", "child": "kept\n", "parent_after": "paused"}, fork
    client = Client(server.url, server.api_key)
    try:  # what /v1 says of the same sandboxes afterwards: all gone
        listed = {s["id"] for s in client.call("GET", "/v1/sandboxes")["items"]}
    finally:
        client.close()
    assert not listed & set(ids.values()), listed
