"""E2B's JavaScript ``Template`` builder, unchanged, against ``cryobox serve``: a build on cryobox's ``base``
(``fromTemplate``: nothing to pull) with its logs streamed, ``exists``, tags, then ``Sandbox.create("name:tag")``
(:mod:`cryobox.compat.e2b.tags`) running what the build left."""

from __future__ import annotations

import secrets

from cryobox.bench.server import ServeProcess
from tests.support.e2b_js import node_app_env, run_node_app


def test_e2b_js_template_build_and_create_by_tag(server: ServeProcess) -> None:
    run = secrets.token_hex(4)
    env = node_app_env(server.url, server.api_key, server.data_dir, E2B_JS_RUN=run)
    report = run_node_app("e2b_template_app.mjs", env)
    name = f"e2b-js-tpl-{run}"
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
