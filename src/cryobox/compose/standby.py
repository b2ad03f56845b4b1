"""A warm standby: a restart of ``cryobox serve`` that waits for no import.

A start spends ~2 s importing before it can do anything (more on a loaded host), so a restart whose new process
starts from nothing cannot answer within a second. A serving process therefore keeps a *standby*: a second
``cryobox serve`` of the same data dir that has imported everything and waits, holding the listening socket. It
registers on the serving process's unix socket ``<data_dir>/standby.sock`` (``standby <pid>``; the answer names the
serving pid) and then only reads that connection:

- ``down`` (the serving process is stopped for good: SIGINT, a stop mode other than ``keep``, an upgrade, which
  starts a fresh process from the new binary): the standby exits;
- the end of the connection without ``down`` (SIGKILL, a crash, or SIGTERM with ``--on-stop keep``: a restart): it
  takes the data dir's lock as soon as the old process released it, adopts every sandbox and serves on the same
  socket. Requests that arrive meanwhile wait in the socket's backlog.

A process that took over waits ``CRYOBOX_STANDBY_GRACE_S`` (30 s) to be *claimed*: a supervisor that restarts the
service (systemd's ``Restart=``, ``systemctl restart``, ``cryobox bench restart``) starts ``cryobox serve`` again,
and that process, finding the data dir served, registers as the new standby — and, as systemd's main process, names
the serving one with ``MAINPID=`` and ``READY=1``. Unclaimed, it stops (``keep``) and exits: a SIGTERM that was a
stop stays a stop, ``CRYOBOX_STANDBY_GRACE_S`` later. A fresh start (no takeover) spawns its own standby once it
serves. ``CRYOBOX_STANDBY=0`` turns all of it off.

A restart is also how an operator applies a changed configuration or an installed upgrade, which a standby started
earlier does not have. Registration therefore exchanges a *fingerprint* (the command line, every ``CRYOBOX_*``
variable, the installed package's version and files' times): a supervisor's start that differs from the serving
process asks it to hand over (``takeover``) instead of standing by, as an upgrade does (:mod:`.handover`): the
serving process stops with ``keep`` and the new one, already imported, takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument
from ..util.envvars import positive_seconds

log = logging.getLogger(__name__)

SOCKET_NAME = "standby.sock"
ENABLE_ENV = "CRYOBOX_STANDBY"
GRACE_ENV = "CRYOBOX_STANDBY_GRACE_S"
SPAWNED_ENV = "CRYOBOX_STANDBY_SPAWNED"
"""Set for a standby the serving process spawned itself: it is not the supervisor's main process, so it names
nobody with ``MAINPID=``."""
SUPERVISED_ENV = "CRYOBOX_STANDBY_SUPERVISED"
"""Set for a process a serve spawns (a standby, an upgrade's successor): whether a supervisor restarts the service."""
DEFAULT_GRACE_S = 30.0
REGISTER_WAIT_S = 60.0
"""How long a start whose data dir is locked keeps trying to register (a takeover binds the socket once it holds
the lock; a process that is only starting holds the lock longer, and the start then fails on the lock as before)."""
DOWN = b"down\n"
TAKEOVER = b"takeover\n"
MAX_PATH = 107  # sockaddr_un's sun_path, less its terminating NUL


def socket_path(data_dir: Path) -> Path:
    return data_dir / SOCKET_NAME


@dataclass(frozen=True)
class StandbySettings:
    enabled: bool = True
    grace_s: float = DEFAULT_GRACE_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StandbySettings:
        """:raises InvalidArgument: a value that is not ``0``/``1`` or a positive number of seconds."""
        env = os.environ if env is None else env
        flag = env.get(ENABLE_ENV, "1").strip()
        if flag not in ("0", "1"):
            raise InvalidArgument(f"{ENABLE_ENV} must be 0 or 1, not {flag!r}")
        return cls(enabled=flag == "1", grace_s=positive_seconds(env, GRACE_ENV, DEFAULT_GRACE_S))


def fingerprint(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> str:
    """What a restart would change: this command line, the ``CRYOBOX_*`` variables (not the standby's own marker)
    and the installed code (its package files' modification times)."""
    env = os.environ if env is None else env
    digest = hashlib.sha256()
    for arg in sys.argv[1:] if argv is None else argv:
        digest.update(arg.encode() + b"\0")
    for key in sorted(k for k in env if k.startswith("CRYOBOX_") and k not in (SPAWNED_ENV, SUPERVISED_ENV)):
        digest.update(f"{key}={env[key]}".encode() + b"\0")
    digest.update(code_fingerprint().encode())
    return digest.hexdigest()[:16]


@functools.cache
def code_fingerprint() -> str:
    """The installed package's files' modification times, read once per process (the code it runs does not change
    under it): ~600 ``stat`` calls, 15-25 ms under load, which a standby reads when it registers and not again on a
    takeover's path."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent
    for path in sorted(package.rglob("*.py")):
        with contextlib.suppress(OSError):
            digest.update(f"{path.relative_to(package)}:{path.stat().st_mtime_ns}".encode() + b"\0")
    return digest.hexdigest()


def usable(data_dir: Path) -> bool:
    """Whether the data dir's socket path fits a unix socket address."""
    return len(str(socket_path(data_dir.resolve())).encode()) <= MAX_PATH


@dataclass
class Registration:
    """This process is the standby of ``active_pid`` (the connection stays open until one of them ends)."""

    sock: socket.socket
    active_pid: int
    active_fingerprint: str

    def request_takeover(self) -> None:
        """Ask the serving process to stop (``keep``) and leave the data dir to this one now."""
        self.sock.sendall(TAKEOVER)

    def wait_turn(self) -> bool:
        """Block until the serving process ends (True: take over) or stands this one down (False)."""
        received = b""
        try:
            while True:
                chunk = self.sock.recv(64)
                if not chunk:
                    return DOWN not in received
                received += chunk
                if DOWN in received:
                    return False
        except OSError:  # reset by a dying peer: it ended without standing this one down
            return DOWN not in received
        finally:
            self.sock.close()


def register(
    data_dir: Path,
    locked: Callable[[], bool],
    mine: str,
    *,
    wait_s: float = REGISTER_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Registration | None:
    """Register as the standby of the process serving ``data_dir``; ``None`` when nobody serves it (``locked()``
    says whether the data dir's lock is held: a lock without an answering socket is a takeover binding it, waited
    for up to ``wait_s``; ``mine``: this process's :func:`fingerprint`)."""
    if not usable(data_dir):
        return None
    path = str(socket_path(data_dir.resolve()))
    deadline = clock() + wait_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(5.0)
            sock.connect(path)
            sock.sendall(f"standby {os.getpid()} {mine}\n".encode())
            answer = _line(sock).split()
            if len(answer) == 3 and answer[0] == "active" and answer[1].isdigit():
                sock.settimeout(None)
                return Registration(sock, int(answer[1]), answer[2])
            sock.close()
        except OSError:  # no socket, nobody listening, or it went away while answering
            sock.close()
        if not locked() or clock() >= deadline:
            return None
        sleep(0.05)


def _line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < 64:
        chunk = sock.recv(64 - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


class StandbyDesk:
    """The serving process's side: it listens on ``standby.sock``, keeps the newest registered standby (an older
    one is stood down) and stands it down or leaves it to take over when this process stops."""

    def __init__(self, data_dir: Path, on_takeover: Callable[[], None], mine: str | None = None) -> None:
        self.path = socket_path(data_dir.resolve())
        self.on_takeover = on_takeover
        """Called when the standby asks to take over now (it differs from this process): stop, keeping the VMs."""
        self.fingerprint = fingerprint() if mine is None else mine
        self.claimed = asyncio.Event()
        """Set when a standby registered (after a takeover: a supervisor's start claimed this process)."""
        self.handing_over = False
        """A standby asked to take over: this process's stop leaves the data dir to it."""
        self._server: asyncio.Server | None = None
        self._standby: tuple[int, asyncio.StreamWriter] | None = None

    @property
    def standby_pid(self) -> int | None:
        return self._standby[0] if self._standby is not None else None

    async def open(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead process's; the data dir's lock says it is ours now
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.path))
        os.chmod(self.path, 0o600)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 5.0)).decode(errors="replace").strip()
        except (TimeoutError, OSError):
            writer.close()
            return
        words = line.split()
        if len(words) != 3 or words[0] != "standby" or not words[1].isdigit():
            writer.close()
            return
        pid = int(words[1])
        writer.write(f"active {os.getpid()} {self.fingerprint}\n".encode())
        with contextlib.suppress(OSError):
            await writer.drain()
        previous, self._standby = self._standby, (pid, writer)
        if previous is not None:
            await _down(previous[1])
            log.info("standby pid %d replaced by pid %d", previous[0], pid)
        log.info("standby pid %d registered: it takes over if this process ends without standing it down", pid)
        self.claimed.set()
        with contextlib.suppress(OSError, asyncio.CancelledError):  # cancelled: this process's loop is ending
            while message := await reader.readline():  # until the standby or this process ends the connection
                if message == TAKEOVER and self._standby is not None and self._standby[1] is writer:
                    log.info("standby pid %d differs from this process (configuration or code): handing over", pid)
                    self.handing_over = True
                    self.on_takeover()
        if self._standby is not None and self._standby[1] is writer:
            self._standby = None
            log.info("standby pid %d ended", pid)

    async def close(self, *, hand_over: bool) -> int | None:
        """Stop listening; with ``hand_over`` (or one asked for: :attr:`handing_over`) the standby is left to take
        over once this process exits (its pid is returned), otherwise it is stood down."""
        hand_over = hand_over or self.handing_over
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if hand_over:
            standby[1].close()  # its end without ``down``: the standby's cue (it then waits for the data dir's lock)
            return standby[0]
        await _down(standby[1])
        return None


async def _down(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        writer.write(DOWN)
        await writer.drain()
        writer.close()
