"""E2B's JavaScript ``Template`` builder, unchanged, against ``cryobox serve``: a build on cryobox's ``base``
(``fromTemplate``: nothing to pull) with its logs streamed, ``exists``, tags, then ``Sandbox.create("name:tag")``
(:mod:`cryobox.compat.e2b.tags`) running what the build left."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx

from cryobox.bench.server import ServeProcess
from tests.support.e2b_js import node_app_env, run_node_app


def test_e2b_js_template_build_and_create_by_tag(server: ServeProcess, cache_dir: Path) -> None:
    run = secrets.token_hex(4)
    name = f"e2b-js-tpl-{run}"
    env = node_app_env(server.url, server.api_key, server.data_dir, E2B_JS_RUN=run)
    try:
        report = run_node_app("e2b_template_app.mjs", env)
    finally:
        # the bake lives in the host's shared template cache: a template left behind is 160 MB there for good
        headers = {"Authorization": f"Bearer {server.api_key}"}
        deleted = httpx.delete(f"{server.url}/v1/templates/{name}", headers=headers, timeout=120)
    assert deleted.status_code == 204, deleted.text
    assert not list((cache_dir / "templates").glob(f"{name}-*")), "the deleted template's bake stayed in the cache"
    assert report["exists_before"] is False and report["exists_after"] is True
    assert report["build"] == {"templateId": name, "buildId": True, "tags": ["default"]}
    assert report["logs_finished"] is True  # the build's log, streamed to onBuildLogs, ends as E2B's does
    assert report["tags"] == ["default", "stable"]
    unknown = report["unknown_tag"]
    assert unknown["class"] == "SandboxError" and unknown["message"].startswith("404:"), unknown
    assert "no-such-tag" in unknown["message"], unknown
    assert report["template_id"] == name
    assert report["run"] == "built-by-js\njs\n/opt/js\n"  # the RUN's file, the ENV, the WORKDIR
    assert report["kill"] is True
