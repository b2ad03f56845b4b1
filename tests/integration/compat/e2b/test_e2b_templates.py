"""E2B's template SDK, unchanged, on real build VMs: a Dockerfile with COPY, ``apt-get install``, ENV, WORKDIR,
USER and a start command with a ready check becomes a template whose sandboxes have all of it, the server already
answering when create returns; a rebuild that changes only the last step reuses the others; a failing step names
itself and leaves no template."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx

from cryobox.bench.server import ServeProcess
from tests.support.e2b import e2b_env
from tests.support.paths import APPS

APP = APPS / "e2b_dockerfile_app.py"


def run(python: Path, server: ServeProcess, context: Path, name: str, extra: str, mode: str) -> dict[str, Any]:
    env = e2b_env(server.url, server.api_key, server.data_dir)
    done = subprocess.run(
        [str(python), str(APP), str(context), name, extra, mode], env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.stdout.strip(), f"no report (rc {done.returncode}): {done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in report, (report, done.stderr[-4000:])
    return report


def test_e2b_sdk_builds_a_dockerfile_template_and_its_sandboxes_run_it(
    e2b_python: Path, server: ServeProcess, tmp_path: Path
) -> None:
    context = tmp_path / "ctx"
    (context / "app").mkdir(parents=True)
    (context / "app" / "hello.txt").write_text("hello over http\n")
    name = f"e2b-df-{uuid.uuid4().hex[:8]}"  # a new name per run; the step cache still serves what it can
    headers = {"Authorization": f"Bearer {server.api_key}"}
    try:
        first = run(e2b_python, server, context, name, "-", "create")
        assert first["exists_before"] is False and first["exists_after"] is True, first
        assert first["build"]["template_id"] == name
        assert any("jq" in line for line in first["logs"]), first["logs"][-20:]
        assert first["served"] == "hello over http\n"
        assert first["probe"] == ["/srv/app", "user", "hello from a dockerfile", '{"a":1}', "built by root"]
        assert first["as_root"] == "root"

        # only the last step differs: every step before it comes from the cache
        second = run(e2b_python, server, context, name, "echo changed-last-step", "build-only")
        assert "build" in second, second
        cached = [line for line in second["logs"] if line.endswith("(cached)")]
        assert len(cached) >= 5, second["logs"]
        ran = [line for line in second["logs"] if "] RUN echo changed-last-step" in line]
        assert ran and not ran[0].endswith("(cached)")
        assert not any("Setting up jq" in line for line in second["logs"])  # apt-get did not run again

        broken = f"{name}-bad"
        failed = run(e2b_python, server, context, broken, "echo about to fail >&2; exit 3", "create")
        assert "build" not in failed and failed["exists_after"] is False, failed
        assert "failed" in failed["build_error"] and "exit" in failed["build_error"], failed["build_error"]
        listed = httpx.get(f"{server.url}/v1/templates", headers=headers).json()["items"]
        assert broken not in [t["name"] for t in listed]
    finally:
        httpx.delete(f"{server.url}/v1/templates/{name}", headers=headers)
