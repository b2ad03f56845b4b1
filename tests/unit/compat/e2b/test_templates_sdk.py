"""E2B's template SDK (the pinned ``e2b``, unchanged, in its own virtualenv) against a served control plane with a
fake agent: ``Template.build`` uploads the COPY context through the signed URL, starts the build, receives every
log line once and in order across pages, ends; a failing build raises ``BuildException`` naming the step; aliases
exist or not; the agent got the recipe with the context blob in the store."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox.agentapi.heartbeat import heartbeat_of
from cryobox.compose.app import create_app, wire_registration
from cryobox.image.recipe.model import Recipe
from cryobox.objstore import keys
from cryobox.objstore.client import open_store
from cryobox.registry import Registry
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter
from tests.support import e2bsteps_standin
from tests.support import registry as registry_support
from tests.support.control import close_control, control_plane
from tests.support.e2b import e2b_env
from tests.support.fake_agent import FakeAgent
from tests.support.paths import APPS
from tests.support.serving import serving

registry = registry_support.sqlite_registry
PYTHON = Path("/var/cache/cryobox/venvs/e2b-2.63.0-ci-2.11.5/bin/python")
pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason="the pinned e2b SDK's virtualenv is not there")


class Served:
    def __init__(self, url: str, key: str, agent: FakeAgent, home: Path) -> None:
        self.url, self.key, self.agent, self.home = url, key, agent, home

    async def run(self, context: Path, name: str, expect: str) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            str(PYTHON),
            str(APPS / "e2b_template_app.py"),
            str(context),
            name,
            expect,
            env=e2b_env(self.url, self.key, self.home),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert out.strip(), err.decode()[-4000:]
        report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return report


@pytest.fixture
async def served(registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    e2bsteps_standin.install(monkeypatch)
    objects = open_store("memory://")
    agent = FakeAgent(name="a", max_sandboxes=64, vcpus=64, memory_mib=1 << 20, objects=objects)
    agent.recipe_log_lines = 60  # 7 phases: 420 lines, five pages of the status route
    control = control_plane(registry, {"a": agent}, objects=objects)
    wire_registration(control)
    app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="x")
    await control.fleet.heartbeat(await heartbeat_of(agent))
    ws = registry.ensure_workspace("alpha").id
    _, key = registry.create_key(ws)
    try:
        async with serving(app) as url:
            yield Served(url, key, agent, tmp_path)
    finally:
        await close_control(control)


def context_dir(tmp_path: Path) -> Path:
    app = tmp_path / "ctx" / "app"
    app.mkdir(parents=True)
    (app / "requirements.txt").write_text("flask\n")
    (app / "main.py").write_text("print('hi')\n")
    return tmp_path / "ctx"


async def test_the_sdk_builds_a_template_and_reads_every_log_line_once(served: Served, tmp_path: Path) -> None:
    report = await served.run(context_dir(tmp_path), "my-tpl", "ok")
    assert "build_error" not in report, report
    assert report["build"]["template_id"] == "my-tpl" and report["tags"] == ["default"]
    assert (report["exists_before"], report["exists_after"], report["unknown_exists"]) == (False, True, False)
    server_lines = [e["message"] for e in report["logs"] if e["message"].endswith("]")]
    (build,) = [args[0] for method, args in served.agent.calls if method == "build_template"]
    recipe = Recipe.from_json(build.spec.recipe or {})
    phases = [
        "FROM debian bookworm",
        *(f"{s.op} {' '.join(s.args)}" for s in recipe.steps),
        f"start: {recipe.start_cmd}",
    ]
    assert server_lines == [f"{p} [{n}]" for p in phases for n in range(60)]
    assert [s.op for s in recipe.steps] == ["COPY", "RUN", "ENV", "WORKDIR", "USER"]
    assert recipe.start_cmd == "python3 -m http.server 8000" and ":8000" in recipe.ready_cmd
    blob = recipe.steps[0].context
    with tarfile.open(fileobj=io.BytesIO(served.agent.objects.get(keys.build_context(blob))), mode="r:gz") as tar:
        assert {"app/requirements.txt", "app/main.py"} <= set(tar.getnames())


async def test_a_failing_build_raises_the_sdks_build_exception(served: Served, tmp_path: Path) -> None:
    served.agent.recipe_fail_step = "2"
    report = await served.run(context_dir(tmp_path), "broken", "fail")
    assert report["build_error"] == "step 2 failed: exit status 1", report
    assert report["exists_after"] is False


async def test_an_upload_url_is_its_own_authorization(served: Served, tmp_path: Path) -> None:
    headers = {"X-API-Key": served.key}
    async with httpx.AsyncClient(base_url=served.url, headers=headers) as http:
        reply = await http.post("/e2b/v3/templates", json={"name": "up", "minFreeDiskMb": 10})
        assert reply.status_code == 400 and "minFreeDiskMb" in reply.json()["message"]
        reply = await http.post("/e2b/v3/templates", json={"name": "up"})
        assert reply.status_code == 202, reply.text
        link = await http.get("/e2b/templates/up/files/h1")
        assert link.status_code == 201 and link.json()["present"] is False
        url = link.json()["url"]
        assert url.startswith(served.url + "/e2b/template-uploads/")
        tampered = url[:-3] + ("AAA" if not url.endswith("AAA") else "BBB")
        async with httpx.AsyncClient() as bare:
            assert (await bare.put(tampered, content=b"x")).status_code == 401
            assert (await http.get("/e2b/templates/up/files/h1")).json()["present"] is False
            assert (await bare.put(url, content=b"x")).status_code == 200
        assert (await http.get("/e2b/templates/up/files/h1")).json()["present"] is True
        assert (await http.get("/e2b/templates/aliases/base")).json() == {"templateID": "base", "public": True}
        assert (await http.get("/e2b/templates/aliases/up")).status_code == 404
