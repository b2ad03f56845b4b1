"""E2B's template catalog (``compat/e2b/catalog.py``) read by the pinned ``e2b`` SDK's own generated client, in its
own virtualenv, after two builds made with ``Template.build``: the list, the default templates, a template with its
builds page by page (``X-Next-Token``), and a build's logs (cursor, limit, direction, level, source) are all parsed
into the SDK's models; a ``teamID`` not the caller's is a 400 the SDK reads as its ``Error``; unknown query
parameters are refused by name."""

from __future__ import annotations

import httpx

from tests.support import e2b_templates
from tests.support import registry as registry_support
from tests.support.e2b_templates import Served

registry = registry_support.sqlite_registry
served = e2b_templates.served


async def test_the_sdks_generated_client_parses_the_catalog_after_two_builds(served: Served) -> None:
    served.agent.recipe_log_lines = 2
    report = await served.app("e2b_catalog_app.py", "cat-tpl")
    first, second = report["builds"]

    assert report["list"]["status"] == 200 and set(report["list"]["kind"]) == {"Template"}, report["list"]
    templates = {t["templateID"]: t for t in report["list"]["templates"]}
    assert set(templates) == {"base", "cat-tpl"}
    mine, base = templates["cat-tpl"], templates["base"]
    assert (mine["buildID"], mine["buildStatus"], mine["buildCount"], mine["cpuCount"]) == (second, "ready", 2, 2)
    assert (mine["public"], mine["isDefault"], mine["names"], mine["diskSizeMB"]) == (False, False, ["cat-tpl"], 8192)
    assert (mine["spawnCount"], mine["lastSpawnedAt"], mine["createdBy"]) == (0, None, None)
    assert mine["createdAt"] <= mine["updatedAt"]
    assert (base["public"], base["isDefault"], base["buildStatus"]) == (True, True, "ready")

    assert report["other_team"]["status"] == 400 and report["other_team"]["kind"] == "Error"
    assert "teamID" in report["other_team"]["message"]
    assert report["defaults"] == {"status": 200, "kind": ["Template"], "ids": ["base"], "is_default": [True]}

    pages = report["pages"]
    assert [p["kind"] for p in pages] == ["TemplateWithBuilds", "TemplateWithBuilds"], pages
    assert [[b["buildID"] for b in p["template"]["builds"]] for p in pages] == [[second], [first]]
    assert all(b["status"] == "ready" and "finishedAt" in b for p in pages for b in p["template"]["builds"])
    assert report["whole"] == {"status": 200, "kind": "TemplateWithBuilds", "builds": [second, first]}

    lines = report["logs"]["logs"]
    assert report["logs"]["kind"] == "TemplateBuildLogsResponse" and len(lines) == 6  # base, 1 step, finalize: 2 each
    assert [e["step"] for e in lines[:2]] == ["base", "base"]
    assert report["logs_first_two"]["logs"] == lines[:2]
    assert report["logs_last_two"]["logs"] == lines[::-1][:2]
    assert report["logs_errors"] == {"status": 200, "kind": "TemplateBuildLogsResponse", "logs": []}
    cursor_lines = report["logs_from_cursor"]["logs"]
    assert cursor_lines and all(e["timestamp"] >= lines[2]["timestamp"][:23] for e in cursor_lines)


async def test_unknown_query_parameters_and_bad_values_are_refused_by_name(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url + "/e2b", headers={"X-API-Key": served.key}) as http:
        for path, query, named in (
            ("/templates", {"sort": "name"}, "sort"),
            ("/templates", {"teamID": "nope"}, "teamID"),
            ("/templates/base", {"offset": "3"}, "offset"),
            ("/templates/base", {"nextToken": "garbage!"}, "nextToken"),
            ("/templates/base", {"limit": "0"}, "limit"),
            ("/default-templates", {"all": "1"}, "all"),
            ("/templates/base/builds/b/logs", {"follow": "1"}, "follow"),
            ("/templates/base/builds/b/logs", {"direction": "sideways"}, "direction"),
            ("/templates/base/builds/b/logs", {"level": "loud"}, "level"),
            ("/templates/base/builds/b/logs", {"source": "elsewhere"}, "source"),
        ):
            reply = await http.get(path, params=query)
            assert reply.status_code == 400 and named in reply.json()["message"], (path, query, reply.text)
        reply = await http.get("/templates", params={"teamID": served.workspace_id})
        assert reply.status_code == 200 and [t["templateID"] for t in reply.json()] == ["base"]
        assert (await http.get("/templates/no-such")).status_code == 404
        assert (await http.get("/templates/base/builds/nope/logs")).status_code == 404
