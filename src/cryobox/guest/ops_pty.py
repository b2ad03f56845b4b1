"""Interactive terminals: ``pty_open`` runs a command on a new pseudo-terminal and streams its output.

``pty_open`` is a long-running streaming op: its first event is ``session`` (data: the session id), then
``output`` events carry what the program writes to the terminal, and the final reply ``{exit_code}`` comes
when the program exited (and the terminal drained). While it runs, other requests act on the session:
``pty_input`` (bytes to the terminal), ``pty_resize`` (TIOCSWINSZ; the kernel sends SIGWINCH) and
``pty_close`` (SIGHUP to the session's process group, SIGKILL if it is still there after a grace period).

The program is a session leader with the terminal as its controlling tty, so job control and Ctrl-C work.
Sessions are owned by a :class:`PtySessions` object (one per agent), never by module state.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import select
import shlex
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .launch import launch_context
from .ops_files import OpError, decode_b64, invalid

Emit = Callable[[str, bytes], None]

CHUNK = 64 * 1024
POLL_MS = 100  # how often the output loop re-checks whether the program exited
EXIT_DRAIN = 0.2  # seconds to keep reading after the program exited (a background child may hold the tty)
CLOSE_GRACE = 2.0  # seconds between SIGHUP and SIGKILL after pty_close
WRITE_TIMEOUT = 10.0  # seconds a pty_input may wait for room in the terminal's input buffer
MAX_DIM = 10_000


def default_command() -> list[str]:
    """A login bash, else the image's ``/bin/sh``. :raises OpError: ``not_found`` when the image has neither."""
    if os.path.exists("/bin/bash"):
        return ["/bin/bash", "-l"]
    if os.path.exists("/bin/sh"):
        return ["/bin/sh"]
    raise OpError("not_found", "this image has neither /bin/bash nor /bin/sh: name the terminal's program")


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def get_winsize(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return cols, rows


def _take_controlling_tty() -> None:  # runs in the child after setsid() and the dup2s onto 0/1/2
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _dimension(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
        raise invalid(f"{key!r} must be an integer from 1 to {MAX_DIM}")
    return value


def _argv(args: dict[str, Any]) -> list[str]:
    cmd = args.get("cmd")
    if cmd is None:
        return default_command()
    if isinstance(cmd, str):
        argv = shlex.split(cmd)
    elif isinstance(cmd, list) and all(isinstance(a, str) for a in cmd):
        argv = list(cmd)
    else:
        raise invalid("'cmd' must be a string, a list of strings or null")
    if not argv or any("\x00" in a for a in argv):
        raise invalid("'cmd' must be a non-empty command without NUL bytes")
    return argv


@dataclass
class PtySession:
    id: str
    master: int
    proc: subprocess.Popen[bytes]
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    closing_since: float | None = None

    def signal_group(self, sig: int) -> None:
        """Signal every process of the terminal's session (background jobs have their own groups)."""
        for pid in session_members(self.proc.pid):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def session_members(sid: int, proc_dir: str = "/proc") -> list[int]:
    """Pids whose session id is ``sid`` (the leader first, if it is alive)."""
    members = []
    try:
        names = os.listdir(proc_dir)
    except OSError:
        return [sid]
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_dir, name, "stat"), "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(name))
    members.sort(key=lambda pid: pid != sid)
    return members or [sid]


class PtySessions:
    """The agent's open terminals; each op method is a handler (``args, emit -> reply``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, PtySession] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _get(self, args: dict[str, Any]) -> PtySession:
        session_id = args.get("session")
        if not isinstance(session_id, str):
            raise invalid("'session' must be a string")
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise OpError("not_found", f"no pty session {session_id!r}")
        return session

    # --- ops -------------------------------------------------------------------------------------------

    def op_open(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        argv = _argv(args)
        cols = _dimension(args, "cols", 80)
        rows = _dimension(args, "rows", 24)
        launch = launch_context(args, term=True)
        master, slave = os.openpty()
        try:
            set_winsize(master, cols, rows)
            if launch.user is not None:
                os.fchown(slave, launch.user.pw_uid, -1)
            proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=launch.cwd,
                env=launch.env,
                start_new_session=True,
                preexec_fn=_take_controlling_tty,
                close_fds=True,
                **launch.ids(),
            )
        except FileNotFoundError as err:
            os.close(master)
            raise OpError("not_found", f"cannot run {argv[0]}: {err.strerror}") from err
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        session = PtySession(id=f"pty-{secrets.token_hex(6)}", master=master, proc=proc)
        with self._lock:
            self._sessions[session.id] = session
        try:
            emit("session", session.id.encode())
            self._pump(session, emit)
            rc = proc.wait()
        finally:
            with self._lock:
                self._sessions.pop(session.id, None)
            if proc.poll() is None:
                session.signal_group(signal.SIGKILL)
                proc.wait()
            with session.write_lock:
                session.master = -1
                os.close(master)
        return {"session": session.id, "exit_code": rc if rc >= 0 else 128 - rc}

    def op_input(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        session = self._get(args)
        data = memoryview(decode_b64(args.get("data"), "data"))
        written = 0
        deadline = time.monotonic() + WRITE_TIMEOUT
        with session.write_lock:
            if session.master < 0:
                raise OpError("not_found", f"pty session {session.id} is closed")
            while written < len(data):
                try:
                    written += os.write(session.master, data[written:])
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise OpError("timeout", "the terminal does not take input") from None
                    select.select([], [session.master], [], 0.05)
                except OSError as err:
                    if err.errno == errno.EIO:  # the program is gone
                        raise OpError("not_found", f"pty session {session.id} has ended") from err
                    raise
        return {"written": written}

    def op_resize(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        session = self._get(args)
        cols = _dimension(args, "cols", 80)
        rows = _dimension(args, "rows", 24)
        with session.write_lock:
            if session.master < 0:
                raise OpError("not_found", f"pty session {session.id} is closed")
            set_winsize(session.master, cols, rows)
        return {"cols": cols, "rows": rows}

    def op_close(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        session = self._get(args)
        session.closing_since = time.monotonic()
        session.signal_group(signal.SIGHUP)
        session.signal_group(signal.SIGCONT)  # a stopped job must run to see the hangup
        return {"closed": True}

    def handlers(self) -> dict[str, Callable[[dict[str, Any], Emit], dict[str, Any]]]:
        return {
            "pty_open": self.op_open,
            "pty_input": self.op_input,
            "pty_resize": self.op_resize,
            "pty_close": self.op_close,
        }

    # --- output loop -----------------------------------------------------------------------------------

    def _pump(self, session: PtySession, emit: Emit) -> None:
        """Emit terminal output until the program exited and the terminal drained (or EOF/EIO)."""
        os.set_blocking(session.master, False)
        poller = select.poll()
        poller.register(session.master, select.POLLIN)
        drain_until: float | None = None
        while True:
            now = time.monotonic()
            if drain_until is None and session.proc.poll() is not None:
                drain_until = now + EXIT_DRAIN
            if drain_until is not None and now >= drain_until:
                return
            if session.closing_since is not None and now - session.closing_since > CLOSE_GRACE:
                session.signal_group(signal.SIGKILL)
            for _fd, revents in poller.poll(POLL_MS):
                if revents & select.POLLIN:
                    try:
                        chunk = os.read(session.master, CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every slave fd is closed
                        return
                    if not chunk:
                        return
                    emit("output", chunk)
                elif revents & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    if session.proc.poll() is not None or revents & select.POLLNVAL:
                        return
                    time.sleep(POLL_MS / 1000)  # hung up but the leader lives on: wait for it
