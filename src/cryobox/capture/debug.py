"""``cryobox debug``: restore a captured failure into an independent sandbox and show what it was doing.

The snapshot is the running machine at the moment of the failure, so a restore is that moment again: the
recorded ``/failure.json``, the process table, the tail of the test log and, for a hang (or when the
recorded process is still alive), the stuck process's kernel stack, wait channel, state and open files.
Each debug run restores its own copy; nothing done in one is seen by another.

``open_shell`` is the client of ``GET /v1/sandboxes/{id}/pty`` (see ``server/routes/pty.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

FAILURE_PATH = "/failure.json"
TEST_LOG = "/work/.cryobox/test.log"
PS_COMMAND = "ps -eo pid,stat,wchan:32,etime,cmd"
LOG_LINES = 60
EXEC_TIMEOUT_S = 60.0


class Shell(Protocol):
    """What the report needs from a sandbox: ``exec`` (the SDK's ``Sandbox``)."""

    @property
    def id(self) -> str: ...

    def exec(self, cmd: str, *, timeout_seconds: float | None = ...) -> Any: ...


def _run(sbx: Shell, cmd: str) -> tuple[int, str]:
    result = sbx.exec(cmd, timeout_seconds=EXEC_TIMEOUT_S)
    return int(result.exit_code), str(result.stdout)


@dataclass
class DebugReport:
    sandbox_id: str
    snapshot_id: str
    failure: dict[str, Any] | None
    ps: str
    log_tail: str | None
    stuck: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    kept: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox_id": self.sandbox_id,
            "snapshot_id": self.snapshot_id,
            "failure": self.failure,
            "ps": self.ps,
            "log_tail": self.log_tail,
            "stuck": self.stuck,
            "notes": self.notes,
            "kept": self.kept,
        }

    def render(self) -> str:
        out: list[str] = [f"restored {self.snapshot_id} into {self.sandbox_id}"]

        def section(title: str, body: str) -> None:
            out.append("")
            out.append(f"== {title} ==")
            out.append(body.rstrip("\n") if body.strip() else "(empty)")

        if self.failure is None:
            section(FAILURE_PATH, "(missing: not a captured failure?)")
        else:
            section(FAILURE_PATH, json.dumps(self.failure, indent=2, sort_keys=True))
        section("processes", self.ps)
        if self.log_tail is not None:
            section(f"{TEST_LOG} (last {LOG_LINES} lines)", self.log_tail)
        if self.stuck is not None:
            s = self.stuck
            alive = "alive" if s.get("alive") else "gone"
            section(
                f"stuck process {s['pid']} ({alive})",
                f"state: {s.get('state') or '-'}\nwchan: {s.get('wchan') or '-'}\ncmdline: {s.get('cmdline') or '-'}",
            )
            section(f"kernel stack of {s['pid']}", s.get("stack") or "")
            section(f"open files of {s['pid']}", s.get("fds") or "")
        for note in self.notes:
            out.append(f"note: {note}")
        return "\n".join(out) + "\n"


def _parse_failure(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"raw": value}


def _stuck_pid(failure: dict[str, Any] | None) -> int | None:
    if failure is None:
        return None
    pid = failure.get("pid")
    if isinstance(pid, bool):
        return None
    if isinstance(pid, int) and pid > 0:
        return pid
    if isinstance(pid, str) and pid.isdigit():
        return int(pid)
    return None


def inspect_stuck(sbx: Shell, pid: int) -> dict[str, Any]:
    proc = f"/proc/{pid}"
    alive = _run(sbx, f"test -d {proc}")[0] == 0
    if not alive:
        return {"pid": pid, "alive": False, "state": None, "wchan": None, "stack": None, "fds": None, "cmdline": None}
    _, state = _run(sbx, f"sed -n 's/^State:[[:space:]]*//p' {proc}/status")
    _, wchan = _run(sbx, f"cat {proc}/wchan; echo")
    _, stack = _run(sbx, f"cat {proc}/stack 2>&1")
    _, fds = _run(sbx, f"ls -l {proc}/fd 2>&1")
    _, cmdline = _run(sbx, f"tr '\\0' ' ' < {proc}/cmdline")
    return {
        "pid": pid,
        "alive": True,
        "state": state.strip() or None,
        "wchan": wchan.strip() or None,
        "stack": stack,
        "fds": fds,
        "cmdline": cmdline.strip() or None,
    }


def collect(sbx: Shell, snapshot_id: str, log_lines: int = LOG_LINES) -> DebugReport:
    """Read the failure record, processes, log tail and (for a hang) the stuck process from ``sbx``."""
    notes: list[str] = []
    rc, text = _run(sbx, f"cat {FAILURE_PATH}")
    failure = _parse_failure(text) if rc == 0 else None
    if failure is None:
        notes.append(f"{FAILURE_PATH} is missing; showing the machine as it is")
    _, ps = _run(sbx, PS_COMMAND)
    rc, tail = _run(sbx, f"test -f {TEST_LOG} && tail -n {log_lines} {shlex.quote(TEST_LOG)}")
    log_tail = tail if rc == 0 else None
    stuck = None
    pid = _stuck_pid(failure)
    if pid is not None and failure is not None:
        details = inspect_stuck(sbx, pid)
        if failure.get("kind") == "hang" or details["alive"]:
            stuck = details
        if failure.get("kind") == "hang" and not details["alive"]:
            notes.append(f"the hung process {pid} is not in the restored machine")
    return DebugReport(
        sandbox_id=sbx.id, snapshot_id=snapshot_id, failure=failure, ps=ps, log_tail=log_tail, stuck=stuck, notes=notes
    )


# --- interactive shell over the pty websocket ------------------------------------------------------------


def pty_url(api_url: str, sandbox_id: str, cols: int, rows: int, cmd: str | None = None) -> str:
    from urllib.parse import urlencode

    base = api_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    params: dict[str, str | int] = {"cols": cols, "rows": rows}
    if cmd:
        params["cmd"] = cmd
    return f"{base}/v1/sandboxes/{sandbox_id}/pty?{urlencode(params)}"


class ShellError(Exception):
    def __init__(self, message: str, code: str = "internal") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass
class _Received:
    exit_code: int | None = None
    error: ShellError | None = None
    first_output: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def _fileno(stream: IO[bytes]) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def _terminal_size(fd: int | None) -> tuple[int, int]:
    """The terminal's size, or ``$COLUMNS`` x ``$LINES`` / 80x24 when there is none (or it says 0x0)."""
    try:
        size = os.get_terminal_size(-1 if fd is None else fd)
        if size.columns > 0 and size.lines > 0:
            return size.columns, size.lines
    except OSError:
        pass
    fallback = shutil.get_terminal_size()
    return max(fallback.columns, 1), max(fallback.lines, 1)


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSADRAIN)  # keep what was typed ahead
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def open_shell(
    api_url: str,
    api_key: str,
    sandbox_id: str,
    *,
    cmd: str | None = None,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    first_output_timeout_s: float = 30.0,
    exit_timeout_s: float = 30.0,
) -> int | None:
    """Run an interactive shell in the sandbox; return its exit code (None if it did not report one).

    With a terminal on stdin the terminal is put in raw mode (restored at the end) and resized along. Without
    one, input is sent line by line once the shell printed something (its prompt), then an end-of-file (^D);
    the call returns when the shell exited, or ``exit_timeout_s`` after the input ended.

    :raises ShellError: the server refused the connection or reported an error.
    """
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    in_stream = stdin if stdin is not None else sys.stdin.buffer
    out_stream = stdout if stdout is not None else sys.stdout.buffer
    in_fd = _fileno(in_stream)
    interactive = in_fd is not None and os.isatty(in_fd)
    cols, rows = _terminal_size(in_fd if in_fd is not None and interactive else _fileno(out_stream))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    got = _Received()
    with contextlib.ExitStack() as stack:
        try:
            ws = stack.enter_context(
                connect(
                    pty_url(api_url, sandbox_id, cols, rows, cmd),
                    additional_headers=headers,
                    open_timeout=60,
                    max_size=None,
                    close_timeout=5,
                )
            )
        except InvalidStatus as err:
            raise ShellError(f"the server refused the terminal: HTTP {err.response.status_code}") from err
        except OSError as err:
            raise ShellError(f"cannot connect to {api_url}: {err}") from err

        def receive() -> None:
            try:
                for message in ws:
                    if isinstance(message, bytes):
                        out_stream.write(message)
                        out_stream.flush()
                        got.first_output.set()
                        continue
                    control = json.loads(message)
                    if "exit_code" in control:
                        got.exit_code = control["exit_code"]
                    elif "error" in control:
                        got.error = ShellError(str(control["error"]), str(control.get("code") or "internal"))
            except ConnectionClosed:
                pass
            finally:
                got.first_output.set()
                got.done.set()

        reader = threading.Thread(target=receive, name="pty-receive", daemon=True)
        reader.start()
        try:
            if in_fd is not None and interactive:
                _pump_terminal(ws, in_fd, got)
            else:
                _pump_lines(ws, in_stream, got, first_output_timeout_s, exit_timeout_s)
        except ConnectionClosed:
            pass
        finally:
            ws.close()
            reader.join(timeout=10)
    if got.error is not None:
        raise got.error
    return got.exit_code


def _pump_lines(ws: Any, stream: IO[bytes], got: _Received, first_timeout: float, exit_timeout: float) -> None:
    got.first_output.wait(first_timeout)  # input typed before the shell is up may be flushed by it
    for line in iter(stream.readline, b""):
        if got.done.is_set():
            return
        ws.send(line)
    if not got.done.wait(1.0):
        ws.send(b"\x04")  # end of input: ^D at the start of a line ends the shell
        got.done.wait(exit_timeout)


def _pump_terminal(ws: Any, fd: int, got: _Received) -> None:
    resized = threading.Event()
    previous = signal.signal(signal.SIGWINCH, lambda signum, frame: resized.set())
    try:
        with _raw(fd):
            while not got.done.is_set():
                if resized.is_set():
                    resized.clear()
                    cols, rows = _terminal_size(fd)
                    ws.send(json.dumps({"resize": [cols, rows]}))
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(fd, 4096)
                if not data:
                    return
                ws.send(data)
    finally:
        signal.signal(signal.SIGWINCH, previous)


# --- the whole command -----------------------------------------------------------------------------------


class Restorable(Shell, Protocol):
    def kill(self) -> None: ...

    def close(self) -> None: ...


def debug(
    snapshot_id: str,
    restore: Callable[[str], Restorable],
    *,
    keep: bool = False,
    shell: Callable[[str], None] | None = None,
    show: Callable[[DebugReport], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DebugReport:
    """Restore ``snapshot_id``, collect the report, ``show`` it, optionally run ``shell(sandbox_id)``, then
    kill the restored copy unless ``keep``."""
    say = progress or (lambda line: None)
    say(f"restoring {snapshot_id}")
    started = time.monotonic()
    sbx = restore(snapshot_id)
    killed = False
    try:
        say(f"restored into {sbx.id} in {time.monotonic() - started:.1f} s; reading it")
        report = collect(sbx, snapshot_id)
        report.kept = keep
        if show is not None:
            show(report)
        if shell is not None:
            shell(sbx.id)
        return report
    finally:
        if keep:
            sbx.close()
        else:
            sbx.kill()
            killed = True
        say(f"{'killed' if killed else 'kept'} {sbx.id}")
