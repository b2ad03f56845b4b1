"""The machinery under :mod:`.ops_procs`: spawning a background process, its output log and its pump thread.

One pump thread per process reads its pipes (or terminal) into a bounded :class:`OutputLog` (oldest chunks
dropped past :data:`BUFFER_BYTES`, the dropped bytes counted), notifies followers through the process's
condition and, once the process exited and its output drained, reaps it. The pump notices the exit with
``waitid(WNOWAIT)`` and reaps only after it marked the process ``reaping`` under that condition's lock, which
``proc_signal`` holds while it signals: a signal never reaches a recycled pid.
"""

from __future__ import annotations

import errno
import os
import pwd
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from .ops_files import OpError, invalid
from .ops_pty import _take_controlling_tty, set_winsize

CHUNK = 64 * 1024  # largest read, buffered chunk and event
BUFFER_BYTES = 2 * 1024 * 1024  # per process
CHUNK_COST = 256  # what a buffered chunk costs besides its bytes: a flood of 1-byte writes stays bounded too
POLL_MS = 100  # how often the pump and followers re-check exit and cancellation
EXIT_DRAIN = 0.2  # seconds output is still read after the process exited (a background child may hold it)
SWEEP_LIMIT = 1024 * 1024  # bytes per stream taken without waiting once the drain time is up
FOLLOW_BATCH = 1024 * 1024  # bytes a follower copies out of the log per lock hold
WRITE_TIMEOUT = 10.0  # seconds a proc_input may wait for room in the pipe or terminal


@dataclass
class _Chunk:
    start: int  # offset of data[0] in everything the process ever wrote
    event: str
    data: bytearray


class OutputLog:
    """A process's output as events at absolute byte offsets; the oldest chunks go past ``limit``."""

    def __init__(self, limit: int = BUFFER_BYTES) -> None:
        self.limit = limit
        self.chunks: deque[_Chunk] = deque()
        self.end = 0  # bytes ever appended
        self.dropped = 0  # bytes discarded from the front (== the offset of the first chunk)
        self._cost = 0

    def append(self, event: str, data: bytes) -> None:
        """Add ``data`` (at most :data:`CHUNK` bytes), filling the last chunk of the same event first."""
        last = self.chunks[-1] if self.chunks else None
        if last is not None and last.event == event and len(last.data) < CHUNK:
            room = CHUNK - len(last.data)
            last.data += data[:room]
            self._cost += len(data[:room])
            self.end += len(data[:room])
            data = data[room:]
        if data:
            self.chunks.append(_Chunk(self.end, event, bytearray(data)))
            self._cost += len(data) + CHUNK_COST
            self.end += len(data)
        while self._cost > self.limit and len(self.chunks) > 1:
            old = self.chunks.popleft()
            self._cost -= len(old.data) + CHUNK_COST
            self.dropped += len(old.data)

    def read(self, cursor: int, limit: int = FOLLOW_BATCH) -> tuple[list[tuple[str, bytes]], int, int]:
        """``(events, new cursor, bytes skipped)`` from offset ``cursor`` on, about ``limit`` bytes at most."""
        skipped = max(self.dropped - cursor, 0)
        cursor += skipped
        tail: list[_Chunk] = []
        for chunk in reversed(self.chunks):
            if chunk.start + len(chunk.data) <= cursor:
                break
            tail.append(chunk)
        pieces: list[tuple[str, bytes]] = []
        taken = 0
        for chunk in reversed(tail):
            data = bytes(chunk.data[cursor - chunk.start :])
            pieces.append((chunk.event, data))
            cursor += len(data)
            taken += len(data)
            if taken >= limit:
                break
        return pieces, cursor, skipped


@dataclass
class Proc:
    pid: int
    tag: str | None
    cmd: str
    args: list[str]
    env: dict[str, str]  # only what the request gave
    cwd: str
    popen: subprocess.Popen[bytes]
    started_at: float  # epoch seconds
    master: int = -1  # the pty's master fd, or -1
    stdin: IO[bytes] | None = None  # the stdin pipe while open
    output: OutputLog = field(default_factory=OutputLog)
    cond: threading.Condition = field(default_factory=threading.Condition)  # guards state and output
    write_lock: threading.Lock = field(default_factory=threading.Lock)  # guards master and stdin
    pty: bool = False
    reaping: bool = False  # exited and about to be reaped: no more signals, no more input
    done: bool = False  # reaped and drained: exit_code and status are set
    exit_code: int | None = None
    status: str | None = None
    ended_at: float = 0.0  # monotonic

    def final(self) -> dict[str, Any]:
        return {"pid": self.pid, "exit_code": self.exit_code, "status": self.status, "exited": True}

    def info(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "tag": self.tag,
            "cmd": self.cmd,
            "args": list(self.args),
            "env": dict(self.env),
            "cwd": self.cwd,
            "pty": self.pty,
            "running": not self.done,
            "exit_code": self.exit_code,
            "status": self.status,
            "started_at": self.started_at,
        }


def signal_status(returncode: int) -> tuple[int, str]:
    """``(exit_code, status)`` the way Go's ProcessState says it: a signal death is exit code -1."""
    if returncode >= 0:
        return returncode, f"exit status {returncode}"
    signum = -returncode
    try:
        name = signal.strsignal(signum) or ""
    except ValueError:
        name = ""
    if not name or name.startswith(("Real-time", "Unknown")):
        return -1, f"signal: signal {signum}"
    if len(name) > 1 and name[1].islower():  # "Killed" -> "killed"; "CPU time ..." and "I/O ..." stay
        name = name[0].lower() + name[1:]
    return -1, f"signal: {name}"


def exited(pid: int, block: bool = False) -> bool:
    """Whether the child exited, without reaping it (its pid stays ours until we do)."""
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        return os.waitid(os.P_PID, pid, flags) is not None
    except ChildProcessError:
        return True


@dataclass(frozen=True)
class StartSpec:
    cmd: str
    args: list[str]
    env: dict[str, str]  # the full environment
    given_env: dict[str, str]
    cwd: str
    tag: str | None
    pty: tuple[int, int] | None  # cols, rows
    stdin: bool
    attach: bool
    user: pwd.struct_passwd | None


def spawn(spec: StartSpec) -> Proc:
    ids: dict[str, Any] = {}
    if spec.user is not None:
        user = spec.user
        ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": os.getgrouplist(user.pw_name, user.pw_gid)}
    argv = [spec.cmd, *spec.args]
    master = slave = -1
    try:
        if spec.pty is not None:
            master, slave = os.openpty()
            set_winsize(master, *spec.pty)
            if spec.user is not None:
                os.fchown(slave, spec.user.pw_uid, -1)
            popen = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=spec.cwd,
                env=spec.env,
                start_new_session=True,
                preexec_fn=_take_controlling_tty,
                close_fds=True,
                **ids,
            )
        else:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd,
                env=spec.env,
                start_new_session=True,
                close_fds=True,
                **ids,
            )
    except FileNotFoundError as err:
        if master >= 0:
            os.close(master)
        raise OpError("not_found", f"cannot run {spec.cmd}: {err.strerror}") from err
    except ValueError as err:
        if master >= 0:
            os.close(master)
        raise invalid(str(err)) from err
    except BaseException:
        if master >= 0:
            os.close(master)
        raise
    finally:
        if slave >= 0:
            os.close(slave)
    proc = Proc(
        pid=popen.pid,
        tag=spec.tag,
        cmd=spec.cmd,
        args=spec.args,
        env=spec.given_env,
        cwd=spec.cwd,
        popen=popen,
        started_at=time.time(),
        master=master,
        stdin=popen.stdin,
        pty=spec.pty is not None,
    )
    for fd in (master, popen.stdin.fileno() if popen.stdin else -1):
        if fd >= 0:
            os.set_blocking(fd, False)
    return proc


def pump(proc: Proc) -> None:
    """The process's pump thread: output into the log until it exited and drained, then reap it."""
    if proc.pty:
        fds = {proc.master: "pty"}
    else:
        assert proc.popen.stdout is not None and proc.popen.stderr is not None
        fds = {proc.popen.stdout.fileno(): "stdout", proc.popen.stderr.fileno(): "stderr"}
    poller = select.poll()
    for fd in fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    try:
        drain_until: float | None = None
        while True:
            if drain_until is None and exited(proc.pid):
                drain_until = time.monotonic() + EXIT_DRAIN
            if drain_until is not None and (not fds or time.monotonic() >= drain_until):
                break
            if not fds:  # every stream closed but it runs on: sleep in waitid until it exits
                exited(proc.pid, block=True)
                continue
            for fd, _revents in poller.poll(POLL_MS):
                if fd in fds and not _read_into(proc, fd, fds[fd]):
                    poller.unregister(fd)
                    del fds[fd]
        for fd in list(fds):  # out of time: what is already buffered, without waiting for EOF
            for _ in range(SWEEP_LIMIT // CHUNK):
                if not _read_into(proc, fd, fds[fd], sweep=True):
                    break
    except Exception as err:  # never expected; a process nobody reads would block forever, so it goes
        print(f"cryobox-guest[{os.getpid()}]: pump of process {proc.pid} failed: {err!r}", file=sys.stderr)
        with proc.cond:
            killpg(proc.pid, signal.SIGKILL)
    finally:
        with proc.cond:
            proc.reaping = True
        returncode = proc.popen.wait()
        with proc.write_lock:
            for pipe in (proc.stdin, proc.popen.stdout, proc.popen.stderr):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:
                        pass
            proc.stdin = None
            if proc.master >= 0:
                os.close(proc.master)
                proc.master = -1
        with proc.cond:
            proc.exit_code, proc.status = signal_status(returncode)
            proc.ended_at = time.monotonic()
            proc.done = True
            proc.cond.notify_all()


def _read_into(proc: Proc, fd: int, event: str, sweep: bool = False) -> bool:
    """Read one chunk into the log; False at EOF or on error (EIO: the terminal's last slave closed), or when
    ``sweep`` and nothing is ready."""
    try:
        chunk = os.read(fd, CHUNK)
    except BlockingIOError:
        return not sweep
    except OSError:
        return False
    if not chunk:
        return False
    with proc.cond:
        proc.output.append(event, chunk)
        proc.cond.notify_all()
    return True


def write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    written = 0
    deadline = time.monotonic() + WRITE_TIMEOUT
    while written < len(view):
        try:
            written += os.write(fd, view[written:])
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OpError("timeout", "the process does not take input") from None
            select.select([], [fd], [], 0.05)
        except OSError as err:
            if err.errno in (errno.EPIPE, errno.EIO):
                raise OpError("not_found", "the process no longer reads its input") from err
            raise
    return written


def killpg(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True
