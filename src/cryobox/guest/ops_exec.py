"""The ``exec`` op: run ``/bin/sh -c CMD`` in its own process group, capturing or streaming its output.

Who runs it, where and with what environment: :func:`.launch.launch_context` (the request's ``user``/``cwd``/
``env`` over the image's defaults); an image without ``/bin/sh`` answers ``not_found``.

One selector loop in the request thread feeds stdin and reads stdout/stderr concurrently. The loop never
waits forever on pipes: after a timeout kill it drains for at most ``KILL_GRACE`` seconds, and after a
normal exit for at most ``EXIT_DRAIN`` seconds (a background grandchild may hold the pipes open).
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from .launch import DEFAULT_HOME, DEFAULT_PATH, checked_cwd, launch_context, shell_argv
from .ops_files import b64, decode_b64, invalid, optional_bool

__all__ = ["DEFAULT_HOME", "DEFAULT_PATH", "ExecSpec", "checked_cwd", "op_exec", "parse_args", "run"]

CHUNK = 64 * 1024
MAX_CAPTURE = 16 * 1024 * 1024  # per stream, when not streaming
KILL_GRACE = 0.5  # seconds the pipes may stay open after the timeout kill
EXIT_DRAIN = 0.2  # seconds the pipes may stay open after the main process exited
POLL_INTERVAL = 0.05  # how often to check whether the main process exited while pipes stay open
SWEEP_LIMIT = 1024 * 1024  # bytes per pipe read without waiting once the drain time is up

Emit = Callable[[str, bytes], None]


@dataclass(frozen=True)
class ExecSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdin: bytes | None
    timeout: float | None
    stream: bool
    ids: dict[str, Any] = field(default_factory=dict)  # Popen's user/group/extra_groups (none: the agent's)


def parse_args(args: dict[str, Any]) -> ExecSpec:
    cmd = args.get("cmd")
    if not isinstance(cmd, str):
        raise invalid("'cmd' must be a string")
    timeout = args.get("timeout_seconds")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
            raise invalid("'timeout_seconds' must be a number or null")
        if timeout < 0:
            raise invalid("'timeout_seconds' must not be negative")
        if math.isinf(timeout):
            timeout = None
    launch = launch_context(args)
    stdin = args.get("stdin")
    return ExecSpec(
        argv=shell_argv(cmd),
        env=launch.env,
        cwd=launch.cwd,
        stdin=None if stdin is None else decode_b64(stdin, "stdin"),
        timeout=None if timeout is None else float(timeout),
        stream=optional_bool(args, "stream", False),
        ids=launch.ids(),
    )


class _Output:
    """One output stream: emitted chunk by chunk when streaming, else accumulated up to MAX_CAPTURE."""

    def __init__(self, name: str, stream: bool, emit: Emit) -> None:
        self.name = name
        self.stream = stream
        self.emit = emit
        self.data = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        if self.stream:
            self.emit(self.name, chunk)
            return
        room = MAX_CAPTURE - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data += chunk


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


def _read_into(fd: int, out: _Output) -> int:
    """Read one chunk into ``out``; return its size, 0 if nothing is ready, -1 at EOF or on error."""
    try:
        chunk = os.read(fd, CHUNK)
    except BlockingIOError:
        return 0
    except OSError:
        return -1
    if not chunk:
        return -1
    out.feed(chunk)
    return len(chunk)


def _pump(proc: subprocess.Popen[bytes], spec: ExecSpec, outputs: dict[int, _Output], start: float) -> bool:
    """Move bytes until the process is done and its pipes are drained; return True if it timed out."""
    sel = selectors.DefaultSelector()
    try:
        for fd, out in outputs.items():
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, out)
        pending = memoryview(spec.stdin or b"")
        stdin: IO[bytes] | None = proc.stdin
        if stdin is not None:
            if pending:
                os.set_blocking(stdin.fileno(), False)
                sel.register(stdin.fileno(), selectors.EVENT_WRITE, None)
            else:
                stdin.close()
        deadline = None if spec.timeout is None else start + spec.timeout
        drain_until: float | None = None
        timed_out = False
        while True:
            now = time.monotonic()
            rc = proc.poll()
            if rc is None and not timed_out and deadline is not None and now >= deadline:
                _kill_group(proc)
                timed_out = True
                drain_until = now + KILL_GRACE
            elif rc is not None and drain_until is None:
                drain_until = now + EXIT_DRAIN
            readers = [k for k in sel.get_map().values() if k.data is not None]
            if (rc is not None and not readers) or (drain_until is not None and now >= drain_until):
                break
            wait = POLL_INTERVAL if rc is None or drain_until is None else drain_until - now
            if deadline is not None and not timed_out:
                wait = min(wait, deadline - now)
            if drain_until is not None:
                wait = min(wait, drain_until - now)
            wait = max(wait, 0.0)
            if sel.get_map():
                events = sel.select(wait)
            else:  # pipes closed but the process still runs: block in wait(), not a sleep loop
                try:
                    proc.wait(timeout=wait if deadline is not None and not timed_out else None)
                except subprocess.TimeoutExpired:
                    pass
                events = []
            for key, _mask in events:
                if key.data is None:  # stdin is writable
                    try:
                        pending = pending[os.write(key.fd, pending[:CHUNK]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # EPIPE: the command stopped reading
                        pending = pending[:0]
                    if not pending and stdin is not None:
                        sel.unregister(key.fd)
                        stdin.close()
                elif _read_into(key.fd, key.data) < 0:
                    sel.unregister(key.fd)
        # Out of time: take what is already buffered in the pipes without waiting for EOF.
        for key in list(sel.get_map().values()):
            if key.data is not None:
                for _ in range(SWEEP_LIMIT // CHUNK):
                    if _read_into(key.fd, key.data) <= 0:
                        break
        return timed_out
    finally:
        sel.close()


def run(spec: ExecSpec, emit: Emit) -> dict[str, Any]:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL if spec.stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=spec.cwd,
            env=spec.env,
            start_new_session=True,
            close_fds=True,
            **spec.ids,
        )
    except ValueError as exc:  # e.g. a NUL byte in cmd or env
        raise invalid(str(exc)) from exc
    assert proc.stdout is not None and proc.stderr is not None
    out = _Output("stdout", spec.stream, emit)
    err = _Output("stderr", spec.stream, emit)
    try:
        timed_out = _pump(proc, spec, {proc.stdout.fileno(): out, proc.stderr.fileno(): err}, start)
    finally:
        if proc.poll() is None:
            _kill_group(proc)  # only reached when _pump itself failed
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
    rc = proc.wait()
    if timed_out:
        exit_code = 128 + int(signal.SIGKILL)
    else:
        exit_code = rc if rc >= 0 else 128 - rc
    return {
        "exit_code": exit_code,
        "stdout": b64(out.data),
        "stderr": b64(err.data),
        "duration_ms": round((time.monotonic() - start) * 1000.0, 3),
        "timed_out": timed_out,
        "truncated": out.truncated or err.truncated,
    }


def op_exec(args: dict[str, Any], emit: Emit) -> dict[str, Any]:
    return run(parse_args(args), emit)
