"""Upgrades that refuse no request: a running ``cryobox serve`` hands its listening socket to its successor.

``SIGUSR2`` (``kill -USR2 <pid>``; the systemd unit's ``ExecReload=``) asks the running process to start its own
command line again — the binary now installed, so an upgrade — as a child that inherits the listening socket the way
systemd's socket activation passes one (fd 3, ``LISTEN_FDS``: :mod:`.activation`) plus one end of a pipe
(``CRYOBOX_HANDOVER_FD``). The successor imports everything (the slow part of a start, ~2 s here) while the old
process keeps serving, then writes ``ready`` on the pipe and waits for the data dir's lock. The old process then
stops as ``--on-stop keep`` does whatever its mode (uvicorn stops accepting and finishes the requests it holds; VMs,
slots and the memory server stay) and exits, releasing the lock; the successor adopts every sandbox and serves on
the same socket. Requests that arrive in between wait in the socket's backlog: unavailability is the old process's
stop plus the successor's post-import start, not a whole start. A successor that dies before ``ready`` changes
nothing: the old process keeps serving.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..util.tcp import listen_tcp

HANDOVER_ENV = "CRYOBOX_HANDOVER_FD"
READY = b"ready\n"
LAUNCHER = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
"""
"""What systemd does between its fork and the exec: the socket at fd 3 (``SD_LISTEN_FDS_START``) and
``LISTEN_PID`` naming the process that runs cryobox (``os.execv`` keeps the pid)."""
_HIGH_FD = 10  # the pipe's end is moved above fd 3, where the launcher puts the socket


@dataclass
class Successor:
    process: subprocess.Popen[bytes]
    ready_fd: int
    """The pipe's read end: ``ready`` when the successor has imported and waits for the lock; EOF if it died."""

    async def wait_ready(self) -> bool:
        """True once the successor said ``ready``; False if it exited first (the pipe closed)."""
        try:
            data = await asyncio.to_thread(os.read, self.ready_fd, len(READY))
        finally:
            os.close(self.ready_fd)
        return data == READY


def own_command() -> list[str]:
    """This process's command line, runnable again (``python -m cryobox.cli.main …`` or the ``cryobox`` script)."""
    return [sys.executable, "-m", "cryobox.cli.main", *sys.argv[1:]]


def spawn_successor(
    sock: socket.socket,
    argv: list[str],
    extra_env: Mapping[str, str] | None = None,
    env: MutableMapping[str, str] | None = None,
    name: str = "http",
) -> Successor:
    """Start ``argv`` with ``sock`` passed as systemd would, ``extra_env`` and the handover pipe's write end."""
    read_fd, write_fd = os.pipe()
    high = fcntl.fcntl(write_fd, fcntl.F_DUPFD, _HIGH_FD)
    os.close(write_fd)
    try:
        variables = {**(extra_env or {}), HANDOVER_ENV: str(high)}
        process = spawn_with_socket(sock, argv, variables, env=env, name=name, keep_fds=(high,))
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(high)
    return Successor(process, read_fd)


def spawn_with_socket(
    sock: socket.socket,
    argv: list[str],
    extra_env: Mapping[str, str],
    *,
    env: MutableMapping[str, str] | None = None,
    name: str = "http",
    keep_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with ``sock`` passed as systemd's socket activation passes one (fd 3, ``LISTEN_FDS``), plus
    ``extra_env`` and the fds ``keep_fds`` (a successor's handover pipe, a standby's marker)."""
    child_env = {**(os.environ if env is None else env), "LISTEN_FDS": "1", "LISTEN_FDNAMES": name, **extra_env}
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(sock.fileno()), *argv],
        env=child_env,
        stdin=subprocess.DEVNULL,
        pass_fds=(sock.fileno(), *keep_fds),
    )


def take_handover(env: MutableMapping[str, str] | None = None) -> int | None:
    """In a successor: the pipe's fd (the variable removed from ``env``), or None when not started by a handover."""
    raw = (os.environ if env is None else env).pop(HANDOVER_ENV, None)
    if raw is None or not raw.isdigit():
        return None
    os.set_inheritable(int(raw), False)
    return int(raw)


def announce_ready(fd: int) -> None:
    """Tell the predecessor this process is ready to take over (it then stops and releases the data dir)."""
    try:
        os.write(fd, READY)
    finally:
        os.close(fd)


def bind_http(host: str, port: int) -> socket.socket:
    """The plain HTTP listener, bound here (not by uvicorn), so an upgrade has a socket to hand over."""
    try:
        return listen_tcp(host, port)
    except OSError as err:
        raise InvalidArgument(f"cannot listen on {host}:{port}: {err}") from None
