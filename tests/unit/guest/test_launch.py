"""Who runs a process, where, with what environment: the request over the image's defaults over the front
door's default user; and the agent disk's own environment never reaches a child."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from cryobox.guest.defaults import ImageDefaults
from cryobox.guest.launch import launch_context, shell_argv
from cryobox.guest.ops_files import OpError
from cryobox.guest.runtime import on_agent_disk, settle_environ

ROOT = pwd.getpwuid(0).pw_name
OTHER = pwd.getpwuid(65534).pw_name  # nobody


def test_without_defaults_nothing_changes(tmp_path: Path) -> None:
    launch = launch_context({"env": {"X": "1"}}, defaults=ImageDefaults())
    assert launch.user is None and launch.ids() == {}
    assert launch.env["X"] == "1" and launch.given_env == {"X": "1"}


def test_the_image_user_workdir_and_env_apply_when_the_request_names_none(tmp_path: Path) -> None:
    defaults = ImageDefaults(env={"A": "image", "B": "image"}, workdir=str(tmp_path), user=OTHER)
    launch = launch_context({"env": {"B": "request"}, "default_user": ROOT}, defaults=defaults)
    assert launch.user is not None and launch.user.pw_name == OTHER  # the image's USER beats the front door's
    assert launch.env["USER"] == OTHER and launch.env["HOME"] == launch.user.pw_dir
    assert (launch.env["A"], launch.env["B"]) == ("image", "request")  # request env wins
    assert launch.cwd == str(tmp_path)
    assert launch.ids()["user"] == 65534


def test_the_request_wins(tmp_path: Path) -> None:
    defaults = ImageDefaults(workdir="/nonexistent-workdir", user=OTHER)
    launch = launch_context({"user": ROOT, "cwd": str(tmp_path)}, defaults=defaults)
    assert launch.user is not None and launch.user.pw_uid == 0 and launch.cwd == str(tmp_path)


def test_the_front_door_default_applies_only_without_image_defaults() -> None:
    launch = launch_context({"default_user": OTHER}, defaults=ImageDefaults())
    assert launch.user is not None and launch.user.pw_name == OTHER
    assert launch_context({"default_user": "65534"}, defaults=ImageDefaults()).user is not None  # a numeric USER


def test_a_missing_workdir_or_user_fails_clearly() -> None:
    with pytest.raises(OpError, match="does not exist"):
        launch_context({}, defaults=ImageDefaults(workdir="/nonexistent-workdir"))
    with pytest.raises(OpError, match="no user"):
        launch_context({}, defaults=ImageDefaults(user="no-such-user-here"))


def test_an_image_without_a_shell_refuses_a_command_line(tmp_path: Path) -> None:
    assert shell_argv("echo hi") == ["/bin/sh", "-c", "echo hi"]
    with pytest.raises(OpError, match="has no .*sh: a shell command cannot run") as caught:
        shell_argv("echo hi", shell=str(tmp_path / "sh"))
    assert caught.value.code == "not_found"


def test_the_agent_disk_environment_is_dropped_before_any_child() -> None:
    assert on_agent_disk("/.cryobox/python") and not on_agent_disk("/usr") and not on_agent_disk("/.cryoboxes")
    environ = {"LC_ALL": "C", "PATH": "/bin"}
    settle_environ(environ, prefix="/usr")
    assert environ == {"LC_ALL": "C", "PATH": "/bin"}  # the image's python: left alone
    settle_environ(environ, prefix="/.cryobox/python")
    assert environ == {"PATH": "/bin"}
