"""The warm standby's protocol (``compose/standby.py``) over a real unix socket: a standby registers and learns the
server's pid and fingerprint; it is stood down, or left to take over, as the server's stop means; a newer standby
replaces an older one; one with another fingerprint asks to take over; nobody serving is a plain start. And
``PromptServer`` stops without uvicorn's 0.1 s ticks."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from cryobox.cli.serve_standby import is_supervised, restarts_under_way
from cryobox.compose.activation import Activation
from cryobox.compose.standby import (
    SPAWNED_ENV,
    SUPERVISED_ENV,
    Registration,
    StandbyDesk,
    StandbySettings,
    code_fingerprint,
    fingerprint,
    register,
)
from cryobox.errors import InvalidArgument
from cryobox.util.tcp import listen_tcp
from tests.unit.compose.test_draining import serving_app


def test_settings_from_the_environment() -> None:
    assert StandbySettings.from_env({}) == StandbySettings(enabled=True, grace_s=30.0)
    assert StandbySettings.from_env({"CRYOBOX_STANDBY": "0", "CRYOBOX_STANDBY_GRACE_S": "2.5"}) == StandbySettings(
        enabled=False, grace_s=2.5
    )
    for bad in ({"CRYOBOX_STANDBY": "yes"}, {"CRYOBOX_STANDBY_GRACE_S": "soon"}, {"CRYOBOX_STANDBY_GRACE_S": "0"}):
        with pytest.raises(InvalidArgument):
            StandbySettings.from_env(bad)


def test_the_fingerprint_follows_the_command_line_and_cryobox_variables_only() -> None:
    base = fingerprint(["serve", "--port", "8080"], {"CRYOBOX_ON_STOP": "keep", "HOME": "/root"})
    assert base == fingerprint(["serve", "--port", "8080"], {"CRYOBOX_ON_STOP": "keep", "HOME": "/tmp"})
    assert base == fingerprint(  # the standby's own markers are not configuration
        ["serve", "--port", "8080"], {"CRYOBOX_ON_STOP": "keep", SPAWNED_ENV: "1", SUPERVISED_ENV: "1"}
    )
    assert base != fingerprint(["serve", "--port", "8081"], {"CRYOBOX_ON_STOP": "keep"})
    assert base != fingerprint(["serve", "--port", "8080"], {"CRYOBOX_ON_STOP": "kill"})


def test_the_code_is_read_once_per_process() -> None:
    code_fingerprint.cache_clear()
    fingerprint(["serve"], {})
    fingerprint(["serve", "--port", "1"], {"CRYOBOX_ON_STOP": "kill"})
    assert code_fingerprint.cache_info().misses == 1  # a takeover's desk does not walk the package again


def test_supervised_when_a_socket_was_passed_or_a_parent_says_so() -> None:
    assert not is_supervised(Activation(), {})
    assert is_supervised(Activation(), {SUPERVISED_ENV: "1"})
    env = {SUPERVISED_ENV: "0"}
    passed = Activation(sockets={"http": listen_tcp("127.0.0.1", 0)})
    try:
        assert not is_supervised(passed, env)  # a spawned process of an unsupervised serve, handed its socket
        assert env == {}  # read once: no child of its own sees it
        assert is_supervised(passed, {})
    finally:
        passed.sockets["http"].close()


def test_nobody_serving_is_a_plain_start(tmp_path: Path) -> None:
    assert register(tmp_path, lambda: False, "f") is None


def test_a_locked_data_dir_is_waited_for_until_it_answers_or_the_wait_ends(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert register(tmp_path, lambda: True, "f", wait_s=1.0, clock=lambda: now[0], sleep=sleep) is None
    assert now[0] >= 1.0  # it kept trying for the whole wait


async def _registered(data_dir: Path, mine: str) -> Registration:
    standing = await asyncio.to_thread(register, data_dir, lambda: True, mine, wait_s=5.0)
    assert standing is not None
    return standing


async def test_a_standby_is_stood_down_or_left_to_take_over(tmp_path: Path) -> None:
    takeovers: list[int] = []
    desk = StandbyDesk(tmp_path, lambda: takeovers.append(1), mine="same")
    await desk.open()
    try:
        first = await _registered(tmp_path, "same")
        assert (first.active_pid, first.active_fingerprint) == (os.getpid(), "same")
        await asyncio.wait_for(desk.claimed.wait(), 5)
        second = await _registered(tmp_path, "same")  # a supervisor's start: it replaces the first
        assert await asyncio.wait_for(asyncio.to_thread(first.wait_turn), 5) is False  # stood down
        assert desk.standby_pid == os.getpid()
        assert await desk.close(hand_over=True) == os.getpid()  # a restart: the standby's cue
        assert await asyncio.wait_for(asyncio.to_thread(second.wait_turn), 5) is True
        assert takeovers == [] and not desk.path.exists()
    finally:
        await desk.close(hand_over=False)


async def test_a_stop_for_good_stands_the_standby_down(tmp_path: Path) -> None:
    desk = StandbyDesk(tmp_path, lambda: None, mine="same")
    await desk.open()
    standing = await _registered(tmp_path, "same")
    await asyncio.wait_for(desk.claimed.wait(), 5)
    assert await desk.close(hand_over=False) is None
    assert await asyncio.wait_for(asyncio.to_thread(standing.wait_turn), 5) is False


async def test_a_start_that_differs_asks_to_take_over(tmp_path: Path) -> None:
    asked = asyncio.Event()
    desk = StandbyDesk(tmp_path, asked.set, mine="old")
    await desk.open()
    standing = await _registered(tmp_path, "new")
    assert standing.active_fingerprint == "old"
    standing.request_takeover()
    await asyncio.wait_for(asked.wait(), 5)  # the server is told to stop, keeping its VMs
    assert desk.handing_over
    assert await desk.close(hand_over=False) == os.getpid()  # handed over though its stop was no restart
    assert await asyncio.wait_for(asyncio.to_thread(standing.wait_turn), 5) is True


async def test_the_server_stops_without_waiting_for_a_tick() -> None:
    """uvicorn's own server needs at least its 0.1 s sleep after asking connections to close, plus up to a 0.1 s
    tick to notice the stop; ``http_server``'s stops at once (the best of three runs, against a loaded host)."""
    took = []
    for _ in range(3):
        sock, server, serving = await serving_app()
        await asyncio.sleep(0.03)  # into a tick
        asked = time.monotonic()
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        took.append(time.monotonic() - asked)
        sock.close()
    assert min(took) < 0.09, took


def test_a_restart_under_way_is_found_by_its_command_line(tmp_path: Path) -> None:
    """What keeps an unclaimed takeover waiting past its grace: another process running this command line (the
    supervisor's restart, still importing); not this process, not one with other arguments."""
    argv = ["serve", "--data-dir", "/var/lib/cryobox"]
    for pid, cmdline in {
        "101": [sys.executable, "-m", "cryobox.cli.main", *argv],  # a spawned or relaunched serve
        "102": ["/opt/cryobox/venv/bin/cryobox", *argv],  # systemd's ExecStart
        "103": ["/opt/cryobox/venv/bin/cryobox", "serve", "--data-dir", "/elsewhere"],
        "104": [],  # a zombie: no command line
        str(os.getpid()): ["/opt/cryobox/venv/bin/cryobox", *argv],  # this process
    }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))
    (tmp_path / "self").mkdir()
    assert restarts_under_way(argv, proc=tmp_path) == [101, 102]
    assert restarts_under_way(["serve", "--data-dir", "/nowhere"], proc=tmp_path) == []
