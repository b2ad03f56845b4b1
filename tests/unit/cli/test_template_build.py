"""``cryobox template build`` in-process (typer's CliRunner, in a worker thread) against a served control plane
with a fake agent: a Dockerfile and a context directory (``.dockerignore`` honoured client-side) builds, its log
lines are printed and the exit code is 0; a failing build exits 1 naming the step, the Dockerfile line and the log
tail; ``--image`` builds from a reference; ``--image-archive`` from a ``docker save`` tar (named after the file, or
by ``--name``, ``--image`` picking the image inside), and with ``-f`` (``FROM archive``) and a directory; a bad
Dockerfile exits 2 with the server's message naming its line, as do misused archive options."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner, Result

from cryobox.cli.main import app
from cryobox.image.recipe.model import Base
from tests.support.buildapp import BuildEnv, build_env, registry, write_context
from tests.support.contexttar import blob_members
from tests.support.oci import write_docker_archive

__all__ = ["build_env", "registry"]  # fixtures


async def run(env: BuildEnv, *args: str) -> Result:
    cli_env = {"CRYOBOX_API_URL": env.url, "CRYOBOX_API_KEY": env.key, "COLUMNS": "200"}
    return await asyncio.to_thread(CliRunner().invoke, app, ["template", "build", *args], env=cli_env)


async def test_a_dockerfile_build_prints_its_log_and_succeeds(build_env: BuildEnv, tmp_path: Path) -> None:
    root = write_context(tmp_path / "ctx")
    (root / "app" / "big.bin").write_bytes(b"x" * 100)
    (root / ".dockerignore").write_text("app/secret.key\n**/*.bin\n")
    options = ["-f", str(root / "Dockerfile"), "--name", "web", "--build-arg", "GREETING=yo", "--cpu", "2"]
    result = await run(build_env, *options, str(root))
    assert result.exit_code == 0, result.output
    assert "template web: done" in result.stdout
    assert "[base] FROM debian bookworm" in result.output and "[finalize] start:" in result.output
    (recipe,) = build_env.recipes()
    copied = {n for s in recipe.steps if s.context for n in blob_members(build_env.agent.build_contexts[s.context])}
    assert {"app/main.py", "app/lib/util.py", "config/settings.toml"} <= copied
    assert not {"app/secret.key", "app/big.bin"} & copied
    assert next(s.env for s in recipe.steps if s.op == "RUN") == ("GREETING=yo",)


async def test_a_failing_build_exits_1_with_the_step_and_tail(build_env: BuildEnv, tmp_path: Path) -> None:
    build_env.agent.recipe_fail_step = "1"
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm\nRUN make all\n")
    result = await run(build_env, "--no-cache", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "failed at step 1, line 2: RUN make all" in result.output
    assert "step 1 failed: exit status 1" in result.output
    assert build_env.recipes()[0].force is True
    as_json = await run(build_env, "--json", "--name", "again", str(tmp_path))
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["details"]["line"] == 2


async def test_image_builds_and_refusals(build_env: BuildEnv, tmp_path: Path) -> None:
    result = await run(build_env, "--image", "ghcr.io/acme/tool:1.0", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "tool" and json.loads(result.stdout)["status"] == "done"
    assert build_env.recipes()[0].base == Base("image", "ghcr.io/acme/tool:1.0")
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm\nVOLUME /x\n")
    bad = await run(build_env, "--name", "bad", str(tmp_path))
    assert bad.exit_code == 2 and "line 2" in bad.output
    assert (await run(build_env, "--image", "x:1", str(tmp_path))).exit_code == 2


async def test_image_archive_builds_and_refusals(build_env: BuildEnv, tmp_path: Path) -> None:
    archive = tmp_path / "busybox.tar"
    write_docker_archive(archive, [{"etc/hello": b"hi\n"}], tags=["busybox:latest", "busybox:1.36"])
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    result = await run(build_env, "--image-archive", str(archive), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "busybox" and json.loads(result.stdout)["status"] == "done"
    named = await run(build_env, "--image-archive", str(archive), "--image", "busybox:1.36", "--name", "bb")
    assert named.exit_code == 0, named.output
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "motd").write_text("hello\n")
    (tmp_path / "Dockerfile").write_text("FROM archive\nCOPY motd /etc/motd\n")
    options = ["--image-archive", str(archive), "-f", str(tmp_path / "Dockerfile"), "--name", "layered"]
    layered = await run(build_env, *options, str(tmp_path / "ctx"))
    assert layered.exit_code == 0, layered.output
    first, second, third = build_env.recipes()
    assert first.base == Base("archive", sha) and second.base == Base("archive", sha, "busybox:1.36")
    assert third.base == Base("archive", sha) and [s.op for s in third.steps] == ["COPY"]
    assert (await run(build_env, "--image-archive", str(tmp_path / "nope.tar"))).exit_code == 2
    assert (await run(build_env, "--image-archive", str(archive), str(tmp_path / "ctx"))).exit_code == 2
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm\n")
    wrong = await run(build_env, "--image-archive", str(archive), "-f", str(tmp_path / "Dockerfile"), "--name", "w")
    assert wrong.exit_code == 2 and "FROM archive" in wrong.output
