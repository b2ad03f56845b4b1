"""``POST /v1/templates/build`` and its build routes over a served control plane with a fake agent: a Dockerfile
with a tar context (honouring ``.dockerignore``), JSON image builds, refusals that name the field or the line and
write nothing (400, 413), a failing build's step, the JSON log pages, the SSE stream (``log`` events with ids,
``done``/``error`` last, ``Last-Event-ID`` resumes), the template view's build fields, reserved names, and the
served OpenAPI document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from cryobox.image.recipe.model import Base
from tests.support.buildapp import DOCKERFILE, BuildEnv, build_env, registry, write_context
from tests.support.contexttar import Member, blob_members, context_tar

__all__ = ["build_env", "registry"]  # fixtures


def _tar_of(root: Path) -> bytes:
    members = [Member(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]
    return context_tar(members, gzipped=True)


async def _post(env: BuildEnv, **kw: Any) -> httpx.Response:
    async with env.client() as http:
        return await http.post("/v1/templates/build", **kw)


def _events(text: str) -> list[tuple[str, str | None, Any]]:
    out: list[tuple[str, str | None, Any]] = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "event" in fields:
            out.append((fields["event"], fields.get("id"), json.loads(fields["data"])))
    return out


async def test_a_dockerfile_with_a_tar_context_builds_and_pages_its_logs(build_env: BuildEnv, tmp_path: Path) -> None:
    tar = _tar_of(write_context(tmp_path / "ctx"))
    reply = await _post(
        build_env,
        data={"name": "web", "dockerfile": DOCKERFILE, "build_args": '{"GREETING": "hey"}', "cpu": "2"},
        files={"context": ("context.tar.gz", tar, "application/gzip")},
    )
    assert reply.status_code == 202, reply.text
    started = reply.json()
    assert started["name"] == "web" and started["status"] in ("queued", "building") and started["cpu"] == 2
    assert started["steps_total"] == 7 and started["logs_url"].endswith(f"/web/builds/{started['id']}/logs")
    final = await build_env.wait_build("web", started["id"])
    assert final["status"] == "done" and final["error"] is None and final["ended_at"] is not None
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("debian", "bookworm")
    copy_app, copy_conf = (s for s in recipe.steps if s.op == "COPY")
    assert ("GREETING=hey",) == next(s.env for s in recipe.steps if s.op == "RUN")
    blob = build_env.agent.build_contexts[copy_app.context]
    assert set(blob_members(blob)) >= {"app/main.py", "app/lib/util.py"}
    assert "app/secret.key" not in blob_members(blob)  # .dockerignore honoured on the server
    assert set(blob_members(build_env.agent.build_contexts[copy_conf.context])) >= {"config/settings.toml"}
    async with build_env.client() as http:
        template = (await http.get("/v1/templates/web")).json()
        assert template["status"] == "ready" and template["build_id"] == started["id"]
        assert template["failed_step"] is None
        page = (await http.get(f"/v1/templates/web/builds/{started['id']}/logs", params={"limit": 5})).json()
        assert page["status"] == "done" and len(page["logs"]) == 5 and page["next_offset"] == 5
        assert page["logs"][0]["step"] == "base" and page["logs"][0]["message"].startswith("FROM debian")
        rest = (await http.get(f"/v1/templates/web/builds/{started['id']}/logs?offset=5&limit=1000")).json()
        assert [e["offset"] for e in rest["logs"]] == list(range(5, 5 + len(rest["logs"])))
        assert (await http.get(f"/v1/templates/other/builds/{started['id']}")).status_code == 404


async def test_an_image_build_is_a_base_image_and_no_steps(build_env: BuildEnv) -> None:
    ref = "ghcr.io/acme/tool:1.2@sha256:" + "a" * 64
    reply = await _post(build_env, json={"name": "img", "image": ref, "memory_mb": 1024})
    assert reply.status_code == 202, reply.text
    assert reply.json()["image_ref"] == ref and reply.json()["memory_mb"] == 1024
    await build_env.wait_build("img", reply.json()["id"])
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("image", ref) and recipe.steps == ()
    bad = await _post(build_env, json={"name": "img2", "image": "UPPER/Case::x"})
    assert bad.status_code == 400 and bad.json()["details"]["field"] == "image"


async def test_refusals_name_the_field_or_line_and_write_nothing(build_env: BuildEnv) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"json": {"name": "x", "dockerfile": "FROM debian:bookworm\nVOLUME /data\n"}}, "line 2"),
        ({"json": {"name": "x", "dockerfile": "FROM debian:bookworm", "kernel": "6.1"}}, "kernel"),
        ({"json": {"name": "x", "dockerfile": "FROM debian:bookworm", "size_mb": 20000}}, "size_mb"),
        ({"json": {"name": "x"}}, "dockerfile"),
        ({"json": {"name": "x", "dockerfile": "FROM a", "image": "b"}}, "dockerfile"),
        ({"json": {"name": "x", "dockerfile": "FROM a", "build_args": ["A"]}}, "build_args"),
        ({"json": {"name": "x", "dockerfile": "FROM a", "no_cache": "maybe"}}, "no_cache"),
        ({"json": {"name": "x", "dockerfile": "FROM a", "context": "Zm9v"}}, "context"),
        ({"json": {"name": "builds", "dockerfile": "FROM debian:bookworm"}}, "reserved"),
        ({"json": {"name": "x", "dockerfile": "FROM debian:bookworm\nCOPY missing /m\n"}}, "missing"),
        ({"content": b"name=x", "headers": {"content-type": "text/plain"}}, "content-type"),
        ({"data": {"name": "x", "dockerfile": "FROM a", "memory_mb": "lots"}}, "memory_mb"),
    ]
    for kw, needle in cases:
        reply = await _post(build_env, **kw)
        assert reply.status_code == 400, (kw, reply.text)
        assert needle in reply.json()["error"], (needle, reply.json())
    big = DOCKERFILE.replace("FROM", "FROM", 1)
    build_env.control.builds.max_context_bytes = 1000
    tar = context_tar([Member("app/main.py", b"x" * 5000), Member("config/settings.toml", b"y")])
    reply = await _post(
        build_env, data={"name": "x", "dockerfile": big}, files={"context": ("c.tar", tar, "application/x-tar")}
    )
    assert reply.status_code == 413, reply.text
    assert build_env.recipes() == [] and build_env.stored_contexts() == []
    async with build_env.client() as http:
        assert (await http.get("/v1/templates/builds")).json() == {"items": []}
        assert (await http.get("/v1/templates/x")).status_code == 404
        assert (await http.post("/v1/templates", json={"name": "builds"})).status_code == 400


async def test_a_failing_build_names_its_step_and_the_stream_ends_with_error(build_env: BuildEnv) -> None:
    build_env.agent.recipe_fail_step = "2"
    dockerfile = "FROM debian:bookworm\nENV A=1\n\nRUN make all\nRUN echo never\n"
    reply = await _post(build_env, data={"name": "broken", "dockerfile": dockerfile, "no_cache": "true"})
    assert reply.status_code == 202, reply.text
    build_id = reply.json()["id"]
    async with build_env.client() as http:
        stream = await http.get(f"/v1/templates/broken/builds/{build_id}/logs/stream")
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = _events(stream.text)
    kinds = [e[0] for e in events]
    assert kinds[-1] == "error" and set(kinds[:-1]) == {"log"}
    assert [int(e[1] or -1) for e in events[:-1]] == list(range(len(events) - 1))
    last = events[-1][2]
    assert last["error"] == "step 2 failed: exit status 1" and last["code"] == "build_failed"
    assert last["build"]["failed_step"] == {"step": "2", "line": 4, "instruction": "RUN make all"}
    assert build_env.recipes()[0].force is True
    final = await build_env.wait_build("broken", build_id)
    assert final["status"] == "failed" and final["failed_step"]["line"] == 4
    async with build_env.client() as http:
        resumed = await http.get(
            f"/v1/templates/broken/builds/{build_id}/logs/stream", headers={"Last-Event-ID": str(len(events) - 3)}
        )
    assert [e[1] for e in _events(resumed.text)[:-1]] == [str(len(events) - 2)]


async def test_the_stream_follows_a_running_build_to_done(build_env: BuildEnv) -> None:
    import asyncio

    gate = build_env.agent.build_gate = asyncio.Event()
    reply = await _post(build_env, json={"name": "slow", "dockerfile": "FROM debian:bookworm\nRUN true\n"})
    build_id = reply.json()["id"]
    seen: list[tuple[str, str | None, Any]] = []
    async with build_env.client() as http:
        async with http.stream("GET", f"/v1/templates/slow/builds/{build_id}/logs/stream") as stream:
            buffer = ""
            async for chunk in stream.aiter_text():
                buffer += chunk
                if not gate.is_set() and buffer.count("event: log") >= 3:
                    gate.set()  # the first step's lines arrived live; let the build go on
            seen = _events(buffer)
    assert seen[-1][0] == "done" and seen[-1][2]["status"] == "done"
    assert [e[2]["step"] for e in seen if e[0] == "log"][-1] == "finalize"


async def test_the_served_openapi_document_describes_the_build_routes(build_env: BuildEnv) -> None:
    async with httpx.AsyncClient(base_url=build_env.url) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    body = paths["/v1/templates/build"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/json"} <= set(body)
    assert "context" in body["multipart/form-data"]["schema"]["properties"]
    for path in (
        "/v1/templates/{name}/builds/{build_id}",
        "/v1/templates/{name}/builds/{build_id}/logs",
        "/v1/templates/{name}/builds/{build_id}/logs/stream",
        "/v1/templates/builds",
        "/v1/templates/builds/{build_id}",
        "/v1/templates/builds/{build_id}/logs",
    ):
        assert "get" in paths[path], path
    streamed = paths["/v1/templates/{name}/builds/{build_id}/logs/stream"]["get"]["responses"]["200"]
    assert "text/event-stream" in streamed["content"]
