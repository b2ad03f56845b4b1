"""``cryobox serve``'s side of the warm standby (:mod:`~cryobox.compose.standby`): standing by at start, keeping a
standby while serving, and telling a restart's stop from a stop for good."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import sys
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rich.console import Console

from ..agent.host.ownership import held_by_other
from ..compose.activation import Activation
from ..compose.handover import own_command, spawn_with_socket
from ..compose.processexit import exit_now
from ..compose.sdnotify import notify
from ..compose.standby import SPAWNED_ENV, SUPERVISED_ENV, StandbyDesk, fingerprint, register
from ..util.procfs import PROC, cmdline, pids
from . import IMPORT_NICENESS

if TYPE_CHECKING:
    import uvicorn

SPAWN_DELAY_S = 2.0
"""A start spawns its standby this long after it serves (the standby's imports take a core for ~2 s)."""


def is_supervised(activation: Activation, env: MutableMapping[str, str] | None = None) -> bool:
    """Whether a supervisor restarts this service (it passed the listening socket, as systemd's socket activation
    does): a process this one spawns (a standby, an upgrade's successor) is told, since it is passed the socket by
    its parent either way. Only a supervised service keeps a standby: nobody else would claim one that took over."""
    told = (os.environ if env is None else env).pop(SUPERVISED_ENV, None)
    return told == "1" if told is not None else activation.get("http") is not None


def supervision_env(supervised: bool) -> dict[str, str]:
    return {SUPERVISED_ENV: "1" if supervised else "0"}


class Start(enum.Enum):
    """How a process that found its data dir served came to serve it."""

    STOOD_BY = "stood_by"
    """It stood by and its server ended without standing it down: a restart, if a supervisor claims it soon."""
    ASKED = "asked"
    """A supervisor's start with another configuration or code: the server handed over on its request."""


def stand_by(data_dir: Path, console: Console, spawned: bool, prepare: Callable[[], object]) -> Start | None:
    """If a process serves ``data_dir`` already, become its standby; returns once this process is to take over (the
    server ended without standing it down, or handed over on request), exits if it was stood down; ``None`` when
    nobody serves it (a plain start). A start by a supervisor (not ``spawned`` by the server) that matches the server
    names it as the service's main process, ready; one that differs asks it to hand over. ``prepare`` runs once
    registered, before the wait: what a takeover would otherwise do first."""
    mine = fingerprint()
    standing = register(data_dir, lambda: held_by_other(data_dir), mine)
    if standing is None:
        return None
    active = standing.active_pid
    asked = not spawned and standing.active_fingerprint != mine
    if asked:  # a restart to apply a change (configuration, an installed upgrade): take over now
        console.print(
            f"standby: pid {active} serves {data_dir} with another configuration or code; taking over", soft_wrap=True
        )
        standing.request_takeover()
    else:
        if not spawned:
            notify(f"MAINPID={active}", "READY=1", "STATUS=serving (this start is its standby)")
        console.print(f"standby: pid {active} serves {data_dir}; this process takes over if it ends", soft_wrap=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stand_down)
    try:
        prepare()
        turn = standing.wait_turn()
    except SystemExit:
        turn = False
    if not turn:
        console.print("standby: stood down")
        exit_now()
    console.print(f"standby: pid {active} ended; taking over")
    return Start.ASKED if asked else Start.STOOD_BY


def _stand_down(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def restore_priority() -> None:
    """Undo the niceness ``cryobox.cli`` gave this process's imports (:data:`cryobox.cli.IMPORT_NICENESS`)."""
    if IMPORT_NICENESS:
        with contextlib.suppress(OSError):  # lowering niceness needs CAP_SYS_NICE: without it, it stays
            os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - IMPORT_NICENESS)


def restarts_under_way(argv: Sequence[str], proc: Path = PROC) -> list[int]:
    """Other processes running this command line (``argv``: the arguments after the program), e.g. a supervisor's
    restart still importing under load: a takeover waits for it to claim this process rather than stop at the end
    of its grace (the restart would then find nobody serving and start from scratch: a second outage)."""
    tail = list(argv)
    if not tail:
        return []
    found = []
    for pid in pids(proc):
        args = cmdline(pid, proc) if pid != os.getpid() else None
        if args is not None and args[-len(tail) :] == tail:
            found.append(pid)
    return sorted(found)


def record_stop_signals(server: uvicorn.Server) -> list[int]:
    """The signals that stopped ``server`` (uvicorn installs ``handle_exit`` as the handler when it serves)."""
    seen: list[int] = []
    original = server.handle_exit

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        seen.append(sig)
        original(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    return seen


async def keep_standby(
    desk: StandbyDesk,
    server: uvicorn.Server,
    activation: Activation,
    start: Start | None,
    grace_s: float,
    console: Console,
) -> None:
    """Once ``server`` serves: listen for standbys. After a takeover nobody asked for, wait ``grace_s`` to be claimed
    by a supervisor's start (else stop, ``keep``: the signal was a stop); otherwise spawn a standby."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.02)
    await desk.open()
    if start is Start.STOOD_BY:
        while True:
            try:
                await asyncio.wait_for(desk.claimed.wait(), grace_s)
                return
            except TimeoutError:
                pass
            starting = await asyncio.to_thread(restarts_under_way, sys.argv[1:])
            if not starting:
                break
            console.print(f"standby: a restart (pid {starting[0]}) is still starting; waiting for it", soft_wrap=True)
        console.print(
            f"standby: took over and nobody restarted the service within {grace_s:g} s; stopping (keep)",
            soft_wrap=True,
        )
        server.should_exit = True
        return
    sock = activation.get("http")
    if sock is None:
        return
    await asyncio.sleep(SPAWN_DELAY_S)  # the first requests after a start go first
    process = spawn_with_socket(sock, own_command(), {SPAWNED_ENV: "1", **supervision_env(True)})
    console.print(f"standby: pid {process.pid} starting")
    while process.poll() is None:  # reaped when it ends (stood down, or replaced by a supervisor's start)
        await asyncio.sleep(1.0)
