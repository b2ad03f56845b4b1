"""Custom template images: the host only downloads and copies (no package code, chroot or dpkg runs there),
builds wait in a bounded queue, built-in image builds refuse tenant additions, and the operator's allowlist."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from cryobox.agent.templates.buildvm import BUILD_DIR, BUILD_LABEL, BuildQueue, _prepare_image
from cryobox.errors import BuildQueueFull, Forbidden, ImageBuildError
from cryobox.image.builder import build_images
from cryobox.image.buildpolicy import BuildAllowlist, BuildLimits, project_of
from cryobox.image.specs import BASE, derived_spec

HOST_ONLY = {"cp", "apt-get", "mkfs.ext4", sys.executable}


class SpyRunner:
    """Records every host command; fakes the effects of cp, apt-get and mkfs."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **_: object) -> str:
        self.calls.append(list(argv))
        if argv[0] == "cp":
            Path(argv[-1]).mkdir(parents=True)
            (Path(argv[-1]) / "etc").mkdir()
            (Path(argv[-1]) / "sbin").mkdir()
        elif argv[0] == "apt-get" and "--download-only" in argv:
            cache = next(a.split("=", 1)[1] for a in argv if a.startswith("Dir::Cache="))
            (Path(cache) / "archives" / "jq_1.6_amd64.deb").write_bytes(b"!<arch>\n")
        elif argv[0] == "mkfs.ext4":
            Path(argv[-2]).write_bytes(b"")
        return ""


def test_the_host_downloads_and_writes_a_disk_but_runs_no_package(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "var/lib/dpkg").mkdir(parents=True)
    (tree / "var/lib/dpkg/status").write_text("Package: python3\nStatus: install ok installed\n")
    runner = SpyRunner()
    out = tmp_path / "out"
    out.mkdir()
    _prepare_image(tree, out, out / "rootfs.ext4", ("jq",), ("pytest",), lambda _line: None, runner)  # type: ignore[arg-type]
    assert {argv[0] for argv in runner.calls} <= HOST_ONLY
    flat = [" ".join(argv) for argv in runner.calls]
    assert not [c for c in flat if "chroot" in c or "dpkg " in c or "debootstrap" in c or "pip install" in c]
    update, install = [argv for argv in runner.calls if argv[0] == "apt-get"]
    assert update[-1] == "update" and install[-3:] == ["install", "--download-only", "jq"]
    assert f"Dir::State::status={tree / 'var/lib/dpkg/status'}" in install  # resolved against the base tree
    downloads = [argv for argv in runner.calls if argv[0] == sys.executable]
    assert all(argv[3] == "download" and "--only-binary=:all:" in argv for argv in downloads)
    assert downloads[0][-1] == "pytest" and downloads[1][-2:] == ["--no-deps", "pip"]
    mkfs = next(argv for argv in runner.calls if argv[0] == "mkfs.ext4")
    assert mkfs[mkfs.index("-L") + 1] == BUILD_LABEL
    staged = Path(mkfs[mkfs.index("-d") + 1])
    assert not staged.exists()  # the staging tree is gone once the disk is written
    assert (out / "rootfs.ext4").exists()


def test_the_staged_disk_carries_the_downloads_and_requirements(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "var/lib/dpkg").mkdir(parents=True)
    (tree / "var/lib/dpkg/status").write_text("")
    seen: dict[str, list[str]] = {}

    class Keep(SpyRunner):
        def __call__(self, argv: list[str], **kw: object) -> str:
            if argv[0] == "mkfs.ext4":
                staged = Path(argv[argv.index("-d") + 1]) / BUILD_DIR
                seen["files"] = sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file())
                seen["requirements"] = (staged / "requirements.txt").read_text().splitlines()
            return super().__call__(argv, **kw)

    out = tmp_path / "out"
    out.mkdir()
    _prepare_image(tree, out, out / "rootfs.ext4", ("jq",), ("a==1", "b"), lambda _line: None, Keep())  # type: ignore[arg-type]
    assert seen["files"] == ["debs/jq_1.6_amd64.deb", "requirements.txt"]
    assert seen["requirements"] == ["a==1", "b"]


def test_built_in_image_builds_refuse_what_a_tenant_adds(tmp_path: Path) -> None:
    for spec in (derived_spec("t", BASE, packages=("jq",)), derived_spec("t", BASE, pip=("pytest",))):
        with pytest.raises(ImageBuildError, match="build VM"):
            build_images(tmp_path, spec, lambda _line: None, SpyRunner())  # type: ignore[arg-type]
    same = derived_spec("t", BASE, packages=BASE.packages)
    assert same.added_packages == () and same.base_spec() is BASE


async def test_the_queue_runs_one_build_at_a_time_and_refuses_past_its_depth() -> None:
    queue = BuildQueue(BuildLimits(concurrency=1, depth=2))
    running = most = 0
    gate = asyncio.Event()
    lines: list[str] = []

    async def build() -> None:
        nonlocal running, most
        async with queue.turn(lines.append):
            running += 1
            most = max(most, running)
            await gate.wait()
            running -= 1

    tasks = [asyncio.create_task(build()) for _ in range(3)]  # one runs, two wait
    for _ in range(100):
        if queue.waiting == 2:
            break
        await asyncio.sleep(0)
    assert queue.waiting == 2 and running == 1
    with pytest.raises(BuildQueueFull):
        async with queue.turn(lines.append):
            raise AssertionError("a fourth build got a turn")
    gate.set()
    await asyncio.gather(*tasks)
    assert most == 1 and queue.waiting == 0
    assert lines.count("queued: waiting for this host's build VM") == 2


def test_allowlist_patterns_and_pip_project_names() -> None:
    assert project_of("Requests[socks]>=2") == "requests" and project_of("zope.interface==6") == "zope-interface"
    anything = BuildAllowlist.from_env({})
    anything.check(derived_spec("t", BASE, packages=("curl",), pip=("x",)))
    nothing = BuildAllowlist.from_env({"CRYOBOX_TEMPLATE_PACKAGES": "", "CRYOBOX_TEMPLATE_PIP": ""})
    nothing.check(derived_spec("t", BASE, files={"/a": "b"}))  # adding no package needs no allowance
    with pytest.raises(Forbidden):
        nothing.check(derived_spec("t", BASE, packages=("jq",)))
    some = BuildAllowlist.from_env({"CRYOBOX_TEMPLATE_PACKAGES": "python3-*, jq", "CRYOBOX_TEMPLATE_PIP": "Zope_*"})
    some.check(derived_spec("t", BASE, packages=("jq", "python3-yaml"), pip=("zope.interface",)))
    with pytest.raises(Forbidden) as refused:
        some.check(derived_spec("t", BASE, packages=("jqx",), pip=("numpy",)))
    assert refused.value.details == {"packages": ["jqx"], "pip": ["numpy"]}
    assert BuildLimits.from_env({"CRYOBOX_BUILD_CONCURRENCY": "2", "CRYOBOX_BUILD_QUEUE": "3"}).per_agent == 5
