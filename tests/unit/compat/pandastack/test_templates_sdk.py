"""PandaStack's SDK (the installed ``pandastack`` 0.10.0, unchanged; sync, so it runs in a worker thread) against a
served control plane with a fake agent: ``build_from_dockerfile`` with a context of files in subdirectories (a
multipart part per file) is answered at once, ``build_logs`` streams the lines and ends at ``data: end``,
``wait_for_build`` returns ``done``; a failing build raises ``TemplateBuildError`` with status ``failed``;
``register(image_ref)`` starts an image build; ``builds()`` lists them; a rootfs upload is refused by name."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pandastack
import pytest
from pandastack.exceptions import BadRequestError, TemplateBuildError

from cryobox.image.recipe.model import Base
from tests.support.buildapp import BuildEnv, build_env, registry, write_context
from tests.support.contexttar import blob_members

__all__ = ["build_env", "registry"]  # fixtures


def client_of(env: BuildEnv) -> pandastack.Client:
    return pandastack.Client(api_url=env.url, api_key=env.key, timeout=30, max_create_retry_seconds=0)


async def test_build_from_dockerfile_waits_for_done(build_env: BuildEnv, tmp_path: Path) -> None:
    context = write_context(tmp_path / "ctx")

    def scenario() -> tuple[pandastack.TemplateBuild, float, list[str], pandastack.TemplateBuild]:
        client = client_of(build_env)
        began = time.monotonic()
        build = client.templates.build_from_dockerfile(
            "web", str(context / "Dockerfile"), context_dir=str(context), cpu=2, memory_mb=1024
        )
        answered = time.monotonic() - began
        lines = list(client.templates.build_logs(build.id, follow=True))
        return build, answered, lines, client.templates.wait_for_build(build.id, poll_interval=0.05)

    build, answered, lines, final = await asyncio.to_thread(scenario)
    assert build.name == "web" and build.status in ("queued", "building") and answered < 30
    assert final.is_done and final.status == "done" and final.error is None
    assert lines[0].startswith("FROM debian bookworm") and lines[-1].startswith("start: ")
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("debian", "bookworm")
    copied = {
        name for s in recipe.steps if s.context for name in blob_members(build_env.agent.build_contexts[s.context])
    }
    assert {"app/main.py", "app/lib/util.py", "config/settings.toml"} <= copied
    assert "app/secret.key" not in copied  # the context's .dockerignore, applied on the server
    spec = next(args[0].spec for method, args in build_env.agent.calls if method == "build_template")
    assert (spec.cpus, spec.memory_mib) == (2, 1024)


async def test_a_failing_build_is_failed_and_raises(build_env: BuildEnv) -> None:
    build_env.agent.recipe_fail_step = "1"

    def scenario() -> TemplateBuildError:
        client = client_of(build_env)
        build = client.templates.build_from_dockerfile("broken", "FROM debian:bookworm\nRUN exit 3\n")
        with pytest.raises(TemplateBuildError) as caught:
            client.templates.wait_for_build(build.id, poll_interval=0.05, timeout_seconds=20)
        return caught.value

    error = await asyncio.to_thread(scenario)
    assert isinstance(error.build, pandastack.TemplateBuild)
    assert error.build.status == "failed" and str(error) == "step 1 failed: exit status 1"


async def test_register_an_image_and_list_builds(build_env: BuildEnv) -> None:
    ref = "registry.example.com:5000/team/tool:2024"

    def scenario() -> tuple[pandastack.TemplateBuild, list[pandastack.TemplateBuild], pandastack.TemplateBuild]:
        client = client_of(build_env)
        build = client.templates.register("tool", ref, size_mb=2048)
        final = client.templates.wait_for_build(build.id, poll_interval=0.05)
        return build, client.templates.builds(), final

    build, listed, final = await asyncio.to_thread(scenario)
    assert build.image_ref == ref and final.is_done
    assert [b.id for b in listed] == [build.id]
    (recipe,) = build_env.recipes()
    assert recipe.base == Base("image", ref) and recipe.steps == ()


async def test_what_cryobox_cannot_do_is_refused_by_name(build_env: BuildEnv, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.tar"
    rootfs.write_bytes(b"x" * 10)

    def scenario() -> list[str]:
        client = client_of(build_env)
        errors: list[str] = []
        calls: list[Callable[[], object]] = [
            lambda: client.templates.build("r", rootfs_tar=str(rootfs)),
            lambda: client.templates.register("k", "debian:12", kernel="6.1"),
            lambda: client.templates.register("s", "debian:12", size_mb=100_000),
        ]
        for call in calls:
            with pytest.raises(BadRequestError) as caught:
                call()
            errors.append(str(caught.value))
        return errors

    errors = await asyncio.to_thread(scenario)
    assert "rootfs" in errors[0] and "kernel" in errors[1] and "size_mb" in errors[2]
    assert build_env.recipes() == []
