"""An application written against PandaStack's SDK works unchanged against ``cryobox serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.paths import APPS

APP = APPS / "pandastack_app.py"


def test_pandastack_sdk_application_runs_unchanged(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> None:
    args = ["--max-concurrent-restores", "1", "--admission-queue", "0"]
    with ServeProcess(tmp_path_factory.mktemp("pds"), cache_dir=cache_dir, prespawn=0, extra_args=args) as srv:
        env = {**os.environ, "PANDASTACK_API": srv.url, "PANDASTACK_API_KEY": srv.api_key, "HOME": str(srv.data_dir)}
        done = subprocess.run([sys.executable, str(APP)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["created"]["status"] == "running"
    assert report["created"]["template"] == "base"
    assert report["created"]["metadata"] == {"app": "pandastack"}
    assert report["created"]["boot_mode"] == "restore"
    assert report["get_status"] == "running" and report["listed"] is True
    assert report["exec"] == {"stdout": "hello\n", "stderr": "oops\n", "exit_code": 4}
    assert report["check"] == 3
    assert report["timeout"] == "SandboxTimeout"
    assert report["stream"] == {"stdout": "1\n2\n3\n", "stderr": "e\n", "exit_code": 5}
    assert report["read"] == "hi from pandastack" and report["read_binary_ok"] is True
    assert report["listdir"] == ["blob.bin", "hello.txt"]
    assert report["stat"] == {"size": 18, "is_dir": False, "name": "hello.txt"}
    assert report["exists"] == [True, False]
    assert report["after_kill"] == "NotFoundError"
    burst = report["burst"]
    assert burst["failures"] == [] and burst["created"] == 4
    assert burst["retries"] and set(burst["retries"]) == {503}, "capacity refusals must have been retried"


def test_pandastack_snapshot_restore_fork_and_fork_tree(server: ServeProcess) -> None:
    env = {
        **os.environ,
        "PANDASTACK_API": server.url,
        "PANDASTACK_API_KEY": server.api_key,
        "HOME": str(server.data_dir),
    }
    done = subprocess.run([sys.executable, str(APP), "lifecycle"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["snapshot"] is True
    assert report["restored"] == {"file": "written before the snapshot", "process": "alive\n"}
    assert report["fork"] == "written before the snapshot"
    assert report["tree"] == ["written before the snapshot"] * 2 and report["tree_ids"] == 2
