"""``POST /v1/templates/build`` with an ``image_archive`` part, over a served control plane with a fake agent: a
``docker save`` tar alone, an OCI layout tar with ``image`` naming one of its images (a failing base named by the
archive's hash), a Dockerfile ``FROM archive`` with a context on top of one; the archive stored as a blob named by
its SHA-256 (the agent fetches it) and deleted with the template; refusals (not an archive, over the archive limit,
over the body limit, a Dockerfile not ``FROM archive``, ``FROM archive`` without one, the archive as a text or JSON
field, twice, with build arguments or a context but no Dockerfile) that name the field, answer 400 or 413, and leave
nothing stored or staged."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from cryobox.image.recipe.model import Base
from tests.support.buildapp import BuildEnv, build_env, registry
from tests.support.contexttar import Member, blob_members, context_tar
from tests.support.oci import LayoutWriter, layout_tar, tar_bytes, write_docker_archive

__all__ = ["build_env", "registry"]  # fixtures

FILES = {"etc/hello": b"hello\n"}
TAR = "application/x-tar"


@pytest.fixture(autouse=True)
def staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the control plane stages uploads (checked to be empty after every request)."""
    where = tmp_path / "staging"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def _docker_save(tmp_path: Path) -> bytes:
    write_docker_archive(tmp_path / "app.tar", [FILES], tags=["acme/app:1"], Cmd=["/bin/sh"])
    return (tmp_path / "app.tar").read_bytes()


async def _post(env: BuildEnv, **kw: Any) -> httpx.Response:
    async with env.client() as http:
        return await http.post("/v1/templates/build", **kw)


def _staged(staging: Path) -> list[str]:
    return [p.name for p in staging.iterdir() if p.name.startswith("cryobox-image-archive-")]


async def test_a_docker_save_archive_alone_is_the_template(build_env: BuildEnv, tmp_path: Path, staging: Path) -> None:
    data = _docker_save(tmp_path)
    sha = hashlib.sha256(data).hexdigest()
    reply = await _post(build_env, data={"name": "app", "cpu": "2"}, files={"image_archive": ("app.tar", data, TAR)})
    assert reply.status_code == 202, reply.text
    assert reply.json()["cpu"] == 2 and reply.json()["image_ref"] is None
    final = await build_env.wait_build("app", reply.json()["id"])
    assert final["status"] == "done", final
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("archive", sha) and recipe.steps == ()
    assert build_env.agent.build_contexts[sha] == data
    assert build_env.stored_contexts() == [f"build-contexts/{sha}"] and _staged(staging) == []
    async with build_env.client() as http:
        assert (await http.delete("/v1/templates/app")).status_code in (200, 204)
    assert build_env.stored_contexts() == []  # the archive went with the template
    async with httpx.AsyncClient(base_url=build_env.url) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    form = paths["/v1/templates/build"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"]["properties"]["image_archive"]["format"] == "binary"


async def test_an_oci_layout_tar_with_the_image_named(build_env: BuildEnv, tmp_path: Path) -> None:
    layout = LayoutWriter(tmp_path / "layout")
    layout.tag("1.0", layout.image([FILES]))
    layout.tag("2.0", layout.image([FILES, {"etc/two": b"2"}]))
    data = layout_tar(layout.root, tmp_path / "layout.tar").read_bytes()
    reply = await _post(
        build_env,
        data={"name": "laid", "image": "2.0", "no_cache": "true"},
        files={"image_archive": ("layout.tar", data, "application/octet-stream")},
    )
    assert reply.status_code == 202, reply.text
    await build_env.wait_build("laid", reply.json()["id"])
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("archive", hashlib.sha256(data).hexdigest(), "2.0") and recipe.force
    build_env.agent.recipe_fail_step = "base"
    reply = await _post(build_env, data={"name": "failing"}, files={"image_archive": ("layout.tar", data, TAR)})
    failed = await build_env.wait_build("failing", reply.json()["id"])
    instruction = "FROM archive " + recipe.base.ref[:12]
    assert failed["failed_step"] == {"step": "base", "line": None, "instruction": instruction}


async def test_a_dockerfile_from_archive_runs_its_steps_on_it(build_env: BuildEnv, tmp_path: Path) -> None:
    data = _docker_save(tmp_path)
    dockerfile = "FROM archive\nCOPY app.py /srv/app.py\nRUN echo hi > /srv/hi\n"
    context = context_tar([Member("app.py", b"print(1)\n")], gzipped=True)
    reply = await _post(
        build_env,
        data={"name": "layered", "dockerfile": dockerfile, "image": "acme/app:1"},
        files=[
            ("image_archive", ("app.tar", data, TAR)),
            ("context", ("context.tar.gz", context, "application/gzip")),
        ],
    )
    assert reply.status_code == 202, reply.text
    assert reply.json()["steps_total"] == 4
    await build_env.wait_build("layered", reply.json()["id"])
    (recipe,) = build_env.recipes()
    sha = hashlib.sha256(data).hexdigest()
    assert recipe.base == Base("archive", sha, "acme/app:1")
    copy = recipe.steps[0]
    assert copy.op == "COPY" and set(blob_members(build_env.agent.build_contexts[copy.context])) == {"app.py"}
    assert recipe.blobs() == (sha, copy.context) and len(build_env.stored_contexts()) == 2


async def test_refusals_name_the_field_and_store_nothing(build_env: BuildEnv, tmp_path: Path, staging: Path) -> None:
    data = _docker_save(tmp_path)
    archive = {"image_archive": ("app.tar", data, TAR)}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"data": {"name": "x"}, "files": {"image_archive": ("x.tar", tar_bytes(FILES), TAR)}}, 400, "image_archive"),
        ({"data": {"name": "x"}, "files": {"image_archive": ("x.tar", b"junk" * 300, TAR)}}, 400, "image_archive"),
        ({"data": {"name": "x", "dockerfile": "FROM debian:bookworm\n"}, "files": archive}, 400, "dockerfile"),
        ({"data": {"name": "x", "build_args": '{"A": "1"}'}, "files": archive}, 400, "build_args"),
        ({"data": {"name": "x", "image": " "}, "files": archive}, 400, "image"),
        (
            {"data": {"name": "x"}, "files": [("image_archive", archive["image_archive"])] * 2},
            400,
            "image_archive",
        ),
        (
            {"data": {"name": "x"}, "files": [*archive.items(), ("context", ("c.tar", context_tar([]), TAR))]},
            400,
            "context",
        ),
        ({"data": {"name": "x", "dockerfile": "FROM archive\n"}}, 400, "image_archive"),
        ({"json": {"name": "x", "dockerfile": "FROM archive\n"}}, 400, "image_archive"),
        ({"json": {"name": "x", "image_archive": "Zm9v"}}, 400, "image_archive"),
        (
            {
                "data": {"name": "x", "image_archive": "app.tar"},
                "files": {"dockerfile": ("D", b"FROM a", "text/plain")},
            },
            400,
            "image_archive",
        ),
        ({"data": {"name": "Bad Name"}, "files": archive}, 400, "name"),
    ]
    for kw, status, field in cases:
        reply = await _post(build_env, **kw)
        assert reply.status_code == status, (kw.get("data") or kw.get("json"), reply.text)
        assert reply.json()["details"].get("field") == field or field in reply.json()["error"], (field, reply.json())
    build_env.control.builds.max_archive_bytes = len(data) - 1
    reply = await _post(build_env, data={"name": "x"}, files=archive)
    assert reply.status_code == 413 and reply.json()["details"]["field"] == "image_archive", reply.text
    build_env.control.builds.max_context_bytes = 10
    reply = await _post(build_env, data={"name": "x"}, files=archive)  # past the whole body's cap
    assert reply.status_code == 413, reply.text
    assert build_env.recipes() == [] and build_env.stored_contexts() == [] and _staged(staging) == []
    async with build_env.client() as http:
        assert (await http.get("/v1/templates/x")).status_code == 404
