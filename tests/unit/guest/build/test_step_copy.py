"""COPY with Docker's semantics, inside the target root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cryobox.guest.build.errors import BuildError
from cryobox.guest.build.state import BuildState, StepSpec
from cryobox.guest.build.step_copy import copy_step
from tests.support.buildtar import TarWriter, tree_state

CONTEXT = "ab" * 32


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\nappuser:x:2000:2001::/home/app:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\napp:x:2001:\nother:x:3000:\n")
    return root


@pytest.fixture
def contexts(tmp_path: Path) -> Path:
    (
        TarWriter()
        .file("app.py", b"print(1)\n", mode=0o644)
        .file("run.sh", b"#!/bin/sh\n", mode=0o755)
        .file("src/pkg/__init__.py", b"")  # no directory entries: implied
        .file("src/pkg/mod.py", b"x = 1\n")
        .file("src/README", b"r")
        .dir("conf", mode=0o750)
        .file("conf/a.conf", b"a")
        .file("conf/b.ini", b"b")
        .symlink("conf/latest", "a.conf")
        .write(tmp_path / "contexts" / f"{CONTEXT}.tar.gz", gz=True)
    )
    return tmp_path / "contexts"


def copy(root: Path, contexts: Path, *args: str, workdir: str = "/", chown: str = "", mode: str = "") -> list[str]:
    logs: list[str] = []
    step = StepSpec("COPY", tuple(args), context=CONTEXT, chown=chown, mode=mode, line=3)
    copy_step(str(root), str(contexts), step, BuildState(workdir=workdir), logs.append)
    return logs


def test_a_file_to_a_file_name_and_into_a_directory(root: Path, contexts: Path) -> None:
    copy(root, contexts, "app.py", "/opt/main.py")
    assert (root / "opt" / "main.py").read_bytes() == b"print(1)\n"
    copy(root, contexts, "app.py", "/srv/")
    assert (root / "srv" / "app.py").is_file()
    copy(root, contexts, "run.sh", "/opt")  # an existing directory: into it
    assert stat.S_IMODE(os.stat(root / "opt" / "run.sh").st_mode) == 0o755


def test_a_relative_dest_is_resolved_against_the_workdir(root: Path, contexts: Path) -> None:
    copy(root, contexts, "app.py", ".", workdir="/work/dir")
    copy(root, contexts, "run.sh", "bin/start", workdir="/work/dir")
    assert (root / "work" / "dir" / "app.py").is_file()
    assert (root / "work" / "dir" / "bin" / "start").is_file()


def test_a_directory_source_copies_its_contents(root: Path, contexts: Path) -> None:
    copy(root, contexts, "src", "/app")
    assert sorted(os.listdir(root / "app")) == ["README", "pkg"]
    assert (root / "app" / "pkg" / "mod.py").read_text() == "x = 1\n"
    copy(root, contexts, "conf/", "/etc/conf")
    assert os.readlink(root / "etc" / "conf" / "latest") == "a.conf"
    assert stat.S_IMODE(os.stat(root / "etc" / "conf").st_mode) == 0o750
    copy(root, contexts, ".", "/whole/")
    assert (root / "whole" / "src" / "pkg" / "__init__.py").exists()
    assert (root / "whole" / "app.py").exists()


def test_globs_and_several_sources_make_dest_a_directory(root: Path, contexts: Path) -> None:
    copy(root, contexts, "conf/*.conf", "conf/*.ini", "/cfg")
    assert sorted(os.listdir(root / "cfg")) == ["a.conf", "b.ini"]
    copy(root, contexts, "*.py", "/one")  # one match, no slash: a file named /one
    assert (root / "one").read_bytes() == b"print(1)\n"
    copy(root, contexts, "src/*/mod.py", "app.py", "/two")
    assert sorted(os.listdir(root / "two")) == ["app.py", "mod.py"]


def test_missing_sources_fail(root: Path, contexts: Path) -> None:
    with pytest.raises(BuildError, match="'nope.txt' is not in the build context"):
        copy(root, contexts, "nope.txt", "/x")
    with pytest.raises(BuildError, match="matches nothing"):
        copy(root, contexts, "*.rb", "/x/")


def test_a_source_cannot_leave_the_context(root: Path, contexts: Path) -> None:
    copy(root, contexts, "../../app.py", "/ctx/")
    assert (root / "ctx" / "app.py").exists()


def test_chown_by_name_from_the_target_and_mode(root: Path, contexts: Path) -> None:
    copy(root, contexts, "src", "/home/app/src", chown="appuser", mode="0640")
    for path in ("home/app/src", "home/app/src/pkg", "home/app/src/pkg/mod.py"):
        st = os.stat(root / path)
        assert (st.st_uid, st.st_gid) == (2000, 2001), path
    assert stat.S_IMODE(os.stat(root / "home/app/src/pkg/mod.py").st_mode) == 0o640
    copy(root, contexts, "app.py", "/x.py", chown="appuser:other")
    assert (os.stat(root / "x.py").st_uid, os.stat(root / "x.py").st_gid) == (2000, 3000)
    copy(root, contexts, "app.py", "/y.py")
    assert (os.stat(root / "y.py").st_uid, os.stat(root / "y.py").st_gid) == (0, 0)
    with pytest.raises(BuildError, match="not octal"):
        copy(root, contexts, "app.py", "/z.py", mode="rwx")


def test_writes_stay_inside_the_root_through_symlinks(root: Path, contexts: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.py").write_text("host file\n")
    before = tree_state(outside)
    (root / "escape").symlink_to(str(outside))
    (root / "up").symlink_to("../../../../" + str(outside).lstrip("/"))
    (root / "final").symlink_to(str(outside / "app.py"))
    copy(root, contexts, "app.py", "/escape/")
    copy(root, contexts, "app.py", "/up/app.py")
    copy(root, contexts, "app.py", "/final")
    assert tree_state(outside) == before
    assert (root / str(outside).lstrip("/") / "app.py").read_bytes() == b"print(1)\n"
    assert not (root / "final").is_symlink()


def test_a_bad_context_name_or_blob_fails(root: Path, contexts: Path) -> None:
    step = StepSpec("COPY", ("a", "/b"), context="../../etc/passwd")
    with pytest.raises(BuildError, match="not a content hash"):
        copy_step(str(root), str(contexts), step, BuildState(), lambda _: None)
    step = StepSpec("COPY", ("a", "/b"), context="cd" * 32)
    with pytest.raises(BuildError, match="cannot read context"):
        copy_step(str(root), str(contexts), step, BuildState(), lambda _: None)
