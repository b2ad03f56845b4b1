"""cryobox's SDK builds templates (``AsyncTemplates`` and the generated ``Templates``) against a served control
plane with a fake agent: a Dockerfile with a context directory packed client-side honouring ``.dockerignore``, live
log lines in order ending with the build, ``wait()`` → done; a failed build raises ``TemplateBuildFailed`` with the
step, Dockerfile line, instruction and the log tail; an image build; image archive builds (a ``docker save`` tar
alone by the sync SDK, an OCI layout tar with a named image and a ``FROM archive`` Dockerfile with a context by the
async one; a file that is no archive is ``InvalidArgument``); a bad Dockerfile is ``InvalidArgument`` naming its
line; the pure context packer."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from cryobox.errors import InvalidArgument, TemplateBuildFailed
from cryobox.image.recipe.model import Base
from cryobox.sdk import AsyncTemplates, Templates
from cryobox.sdk._builds import pack_context
from tests.support.buildapp import BuildEnv, build_env, registry, write_context
from tests.support.contexttar import blob_members
from tests.support.oci import LayoutWriter, layout_tar, write_docker_archive

__all__ = ["build_env", "registry"]  # fixtures


def test_pack_context_leaves_out_what_dockerignore_says(tmp_path: Path) -> None:
    root = write_context(tmp_path / "ctx")
    packed, count = pack_context(root)
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
        assert {m.uid for m in tar.getmembers()} == {0}
    assert names == {".dockerignore", "Dockerfile", "app/main.py", "app/lib/util.py", "config/settings.toml"}
    assert count == 5
    assert pack_context(root)[0] == packed  # deterministic
    with pytest.raises(InvalidArgument):
        pack_context(root / "nope")


async def test_async_build_streams_logs_and_waits_for_done(build_env: BuildEnv, tmp_path: Path) -> None:
    root = write_context(tmp_path / "ctx")
    async with AsyncTemplates(api_url=build_env.url, api_key=build_env.key) as templates:
        build = await templates.build_from_dockerfile(
            "web", dockerfile=root / "Dockerfile", context=root, build_args={"GREETING": "yo"}, cpu=2
        )
        assert build.info.status in ("queued", "building") and build.info.steps_total == 7
        lines = [line async for line in build.logs()]
        assert [line.offset for line in lines] == list(range(len(lines)))
        assert lines[0].step == "base" and lines[-1].step == "finalize"
        assert str(build.info.status) == "done"  # logs() ended with the build
        final = await build.wait()
        assert final.status == "done" and final.cpu == 2
        again = await templates.get_build("web", build.id)
        assert again.info == final
    (recipe,) = build_env.recipes()
    copied = {n for s in recipe.steps if s.context for n in blob_members(build_env.agent.build_contexts[s.context])}
    assert {"app/main.py", "app/lib/util.py", "config/settings.toml"} <= copied and "app/secret.key" not in copied
    assert next(s.env for s in recipe.steps if s.op == "RUN") == ("GREETING=yo",)


async def test_a_failed_build_raises_with_its_step_line_and_tail(build_env: BuildEnv) -> None:
    build_env.agent.recipe_fail_step = "2"
    dockerfile = "FROM debian:bookworm\nWORKDIR /x\nRUN make\n"
    async with AsyncTemplates(api_url=build_env.url, api_key=build_env.key) as templates:
        build = await templates.build_from_dockerfile("broken", dockerfile=dockerfile, no_cache=True)
        seen: list[str] = []
        with pytest.raises(TemplateBuildFailed) as caught:
            await build.wait(on_log=lambda line: seen.append(line.message))
        with pytest.raises(InvalidArgument, match="line 2"):
            await templates.build_from_dockerfile("bad", dockerfile="FROM debian:bookworm\nONBUILD RUN x\n")
    error = caught.value
    assert (error.step, error.line, error.instruction) == ("2", 3, "RUN make")
    assert error.log_tail[-1] == "step 2 failed: exit status 1" and seen[-1] == error.log_tail[-1]
    assert "line 3: RUN make" in str(error) and error.code == "build_failed"


async def test_the_sync_sdk_builds_from_an_image(build_env: BuildEnv) -> None:
    def scenario() -> tuple[str, str | None, list[str]]:
        with Templates(api_url=build_env.url, api_key=build_env.key) as templates:
            build = templates.build_from_image("tool", "docker.io/library/python:3.12-slim", memory_mb=1024)
            lines = [line.message for line in build.logs()]
            return build.wait().status, build.info.image_ref, lines

    status, ref, lines = await asyncio.to_thread(scenario)
    assert status == "done" and ref == "docker.io/library/python:3.12-slim" and lines
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("image", "docker.io/library/python:3.12-slim") and recipe.steps == ()


async def test_the_sync_sdk_builds_from_a_docker_save_archive(build_env: BuildEnv, tmp_path: Path) -> None:
    archive = tmp_path / "busybox.tar"
    write_docker_archive(archive, [{"etc/hello": b"hi\n"}], tags=["busybox:latest"])

    def scenario() -> str:
        with Templates(api_url=build_env.url, api_key=build_env.key) as templates:
            return templates.build_from_image_archive("boxed", archive, cpu=2).wait().status

    assert await asyncio.to_thread(scenario) == "done"
    (recipe,) = build_env.recipes()
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert recipe.base == Base("archive", sha) and recipe.steps == ()
    assert build_env.agent.build_contexts[sha] == archive.read_bytes()


async def test_an_archive_with_a_named_image_under_a_dockerfile(build_env: BuildEnv, tmp_path: Path) -> None:
    layout = LayoutWriter(tmp_path / "layout")
    layout.tag("a", layout.image([{"etc/a": b"a"}]))
    layout.tag("b", layout.image([{"etc/b": b"b"}]))
    archive = layout_tar(layout.root, tmp_path / "layout.tar")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "run.sh").write_text("echo hi\n")
    async with AsyncTemplates(api_url=build_env.url, api_key=build_env.key) as templates:
        build = await templates.build_from_image_archive(
            "onb",
            archive,
            image="b",
            dockerfile="FROM archive\nCOPY run.sh /run.sh\n",
            context=tmp_path / "ctx",
            no_cache=True,
        )
        assert (await build.wait()).status == "done"
        with pytest.raises(InvalidArgument, match="image_archive"):
            await templates.build_from_image_archive("junk", tmp_path / "ctx" / "run.sh")
        with pytest.raises(InvalidArgument, match="not a file"):
            await templates.build_from_image_archive("none", tmp_path / "missing.tar")
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("archive", hashlib.sha256(archive.read_bytes()).hexdigest(), "b") and recipe.force
    assert [s.op for s in recipe.steps] == ["COPY"]
    assert "run.sh" in blob_members(build_env.agent.build_contexts[recipe.steps[0].context])
