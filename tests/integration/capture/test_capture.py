"""``cryobox capture`` and the pytest plugin against a real server: a red run is kept as a retained snapshot with
provenance and evidence, a green one leaves nothing, a hung one is kept with the test still blocked in it."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox import Sandbox, Snapshots
from tests.support.serve import Api, Client

FLAKY = """\
import os
seed = int(os.environ["CRYOBOX_SEED"])
print(f"flaky: seed={seed}", flush=True)
raise SystemExit(1 if seed % 2 == 1 else 0)
"""
HANG = "python3 -c \"import os; r, w = os.pipe(); print('blocking', flush=True); os.read(r, 1)\""
HANG_TIMEOUT_S = 5  # the command is up and blocked within a second; no need to wait longer to call it a hang
PROVENANCE_KEYS = {"commit", "seed", "command", "exit_code", "captured_at", "host", "template", "pid", "kind"}


class Cleanup:
    """Snapshots and sandboxes to delete at the end of a test, whatever happened."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.snapshots: list[str] = []
        self.sandboxes: list[str] = []

    def run(self) -> None:
        for sandbox_id in self.sandboxes:
            try:
                Sandbox.connect(sandbox_id, **self.api).kill()
            except Exception:  # noqa: BLE001 (already gone)
                pass
        with Snapshots(**self.api) as snapshots:
            for snapshot_id in self.snapshots:
                try:
                    snapshots.delete(snapshot_id)
                except Exception:  # noqa: BLE001
                    pass


@pytest.fixture
def cleanup(api: Api) -> Iterator[Cleanup]:
    keeper = Cleanup(api)
    try:
        yield keeper
    finally:
        keeper.run()


def run(api: Api, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CRYOBOX_API_URL": api["api_url"], "CRYOBOX_API_KEY": api["api_key"], "COLUMNS": "200"}
    env.pop("CRYOBOX_CAPTURE_INNER", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )


def capture(api: Api, project: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = run(
        api, "-m", "cryobox.cli.main", "capture", "--template", "base", "--upload", str(project), "--json", *args
    )
    assert done.stdout.strip(), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return done, result


def running_ids(api: Api) -> set[str]:
    return {s.id for s in Sandbox.list(**api) if s.status != "stopped"}


def snapshot_ids(api: Api) -> set[str]:
    with Snapshots(**api) as snapshots:
        return {s.id for s in snapshots.list()}


def restored(api: Api, snapshot_id: str, cleanup: Cleanup) -> Sandbox:
    sbx = Sandbox.create(from_snapshot=snapshot_id, ttl_seconds=600, **api)
    cleanup.sandboxes.append(sbx.id)
    return sbx


def test_capture_red_is_kept_and_green_leaves_nothing(api: Api, tmp_path: Path, cleanup: Cleanup) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "flaky.py").write_text(FLAKY)
    (project / ".venv").mkdir()
    (project / ".venv" / "big").write_text("not uploaded")

    done, result = capture(api, project, "--seed", "1", "--timeout", "120", "--", "python3", "flaky.py")
    if result.get("sandbox_id"):
        cleanup.sandboxes.append(result["sandbox_id"])
    if result.get("snapshot_id"):
        cleanup.snapshots.append(result["snapshot_id"])
    assert done.returncode == 1, done.stderr
    assert result["outcome"] == "failed" and result["exit_code"] == 1
    snap_id = result["snapshot_id"]
    assert "flaky: seed=1" in done.stderr  # with --json the test's output goes to stderr

    with Snapshots(**api) as snapshots:
        snap = snapshots.get(snap_id)
        assert snap.retain
        assert snap.labels["cryobox.capture"] == "failure"
        assert snap.labels["seed"] == "1" and snap.labels["exit_code"] == "1" and snap.labels["template"] == "base"
        names = {f["name"] for f in snapshots.evidence(snap_id)}
        assert {"test.log", "console.log", "qemu.log"} <= names
        assert b"flaky: seed=1" in snapshots.get_evidence(snap_id, "test.log")

    # the kept sandbox is still running (its TTL reaps it)
    assert result["sandbox_id"] in running_ids(api)

    fetched = run(api, "-m", "cryobox.cli.main", "snapshot", "evidence", snap_id, "--out", str(tmp_path / "ev"))
    assert fetched.returncode == 0, fetched.stderr
    assert "flaky: seed=1" in (tmp_path / "ev" / "test.log").read_text()
    assert (tmp_path / "ev" / "console.log").exists()

    sbx = restored(api, snap_id, cleanup)
    failure = json.loads(sbx.filesystem.read("/failure.json"))
    assert PROVENANCE_KEYS <= set(failure)
    assert failure["kind"] == "failure" and failure["exit_code"] == 1 and failure["seed"] == 1
    assert failure["commit"] is None and failure["template"] == "base"
    assert failure["command"] == "python3 flaky.py"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", failure["captured_at"])
    assert sbx.exec("cat /work/flaky.py").stdout == FLAKY
    assert sbx.exec("test -e /work/.venv").exit_code != 0  # excluded from the upload
    sbx.kill()

    before_sandboxes, before_snapshots = running_ids(api), snapshot_ids(api)
    done, result = capture(api, project, "--seed", "2", "--timeout", "120", "--", "python3", "flaky.py")
    assert done.returncode == 0, done.stderr
    assert result["outcome"] == "passed" and result["snapshot_id"] is None
    assert running_ids(api) <= before_sandboxes
    assert result["sandbox_id"] not in running_ids(api)
    assert snapshot_ids(api) == before_snapshots


def test_capture_hang_keeps_the_blocked_process(api: Api, tmp_path: Path, cleanup: Cleanup) -> None:
    tmp_path.joinpath("README").write_text("hang\n")
    started = time.monotonic()
    done, result = capture(api, tmp_path, "--timeout", str(HANG_TIMEOUT_S), "--", HANG)
    if result.get("sandbox_id"):
        cleanup.sandboxes.append(result["sandbox_id"])
    if result.get("snapshot_id"):
        cleanup.snapshots.append(result["snapshot_id"])
    assert done.returncode == 124, done.stderr
    assert result["outcome"] == "hang" and result["exit_code"] is None
    assert time.monotonic() - started >= HANG_TIMEOUT_S
    snap_id = result["snapshot_id"]
    with Snapshots(**api) as snapshots:
        snap = snapshots.get(snap_id)
    assert snap.retain and snap.labels["cryobox.capture"] == "hang" and snap.labels["kind"] == "hang"
    assert "exit_code" not in snap.labels

    sbx = restored(api, snap_id, cleanup)
    failure = json.loads(sbx.filesystem.read("/failure.json"))
    assert PROVENANCE_KEYS <= set(failure)
    assert failure["kind"] == "hang" and failure["exit_code"] is None
    pid = failure["pid"]
    assert isinstance(pid, int)
    state = sbx.exec(f"grep '^State:' /proc/{pid}/status").stdout
    assert "S" in state.split(":", 1)[1], state
    assert "python3" in sbx.exec(f"cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout
    where = sbx.exec(f"cat /proc/{pid}/stack 2>/dev/null; echo; cat /proc/{pid}/wchan").stdout
    assert re.search(r"pipe_read|pipe_wait|anon_pipe_read", where), where
    assert "blocking" in sbx.exec("cat /work/.cryobox/test.log").stdout
    sbx.kill()


def wait_template(client: Client, name: str, spec: dict[str, Any], budget_s: float = 600) -> None:
    response = client.http.post("/v1/templates", json={"name": name, **spec})
    assert response.status_code in (200, 201, 202, 409), response.text
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        body = client.call("GET", f"/v1/templates/{name}")
        if body["status"] == "ready":
            return
        assert body["status"] != "error", f"template {name} failed: {body.get('error')}"
        time.sleep(1)
    raise AssertionError(f"template {name} not ready after {budget_s} s")


def plugin_run(api: Api, template: str, project: Path, cleanup: Cleanup) -> None:
    """``pytest -p cryobox.capture`` on an always-failing test: non-zero exit, the snapshot line, cleaned up."""
    (project / "test_flaky.py").write_text("def test_always_fails() -> None:\n    assert 1 == 2\n")
    done = run(
        api,
        "-m",
        "pytest",
        "-p",
        "cryobox.capture",
        "--cryobox-template",
        template,
        "--cryobox-timeout",
        "120",
        str(project / "test_flaky.py"),
        cwd=project,
    )
    found = re.search(r"captured failing run as snapshot (\S+) \(restore: cryobox debug (\S+)\)", done.stdout)
    if found:
        cleanup.snapshots.append(found.group(1))
        with Snapshots(**api) as snapshots:
            snap = snapshots.get(found.group(1))
        assert snap.sandbox_id is not None  # a captured run's snapshot names the sandbox it ran in
        cleanup.sandboxes.append(snap.sandbox_id)
        assert snap.retain and snap.labels["cryobox.capture"] == "failure"
    assert done.returncode == 1, done.stdout + done.stderr
    assert found and found.group(1) == found.group(2), done.stdout
    assert "assert 1 == 2" in done.stdout and "1 failed" in done.stdout


def test_pytest_plugin_captures_a_failing_run(api: Api, client: Client, tmp_path: Path, cleanup: Cleanup) -> None:
    wait_template(client, "capture-pytest", {"base": "base", "pip": ["pytest"]})
    plugin_run(api, "capture-pytest", tmp_path, cleanup)


def test_pytest_plugin_with_pytest_in_the_upload(api: Api, tmp_path: Path, cleanup: Cleanup) -> None:
    """The same on ``base``, pytest coming with the project (``python3 -m pytest`` finds it in /work): the plugin
    path does not depend on a template with pytest (whose build needs PyPI from the image builder)."""
    site = Path(str(importlib.import_module("pytest").__file__)).parent.parent
    for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py"):
        if (site / name).is_dir():
            shutil.copytree(site / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(site / name, tmp_path / name)
    for dist in ("pytest", "pluggy", "iniconfig", "packaging", "pygments"):  # pytest reads their metadata
        (info,) = site.glob(f"{dist}-*.dist-info")
        shutil.copytree(info, tmp_path / info.name)
    plugin_run(api, "base", tmp_path, cleanup)
