"""E2B's template SDK (the pinned ``e2b``, unchanged, in its own virtualenv) against a served control plane with a
fake agent: ``Template.build`` uploads the COPY context through the signed URL, starts the build, receives every
log line once and in order across pages, ends; a failing build raises ``BuildException`` naming the step; aliases
exist or not; the agent got the recipe with the context blob in the store."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx

from cryobox.image.recipe.model import Recipe
from cryobox.objstore import keys
from tests.support import e2b_templates
from tests.support import registry as registry_support
from tests.support.e2b_templates import Served, context_dir

registry = registry_support.sqlite_registry
served = e2b_templates.served


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
