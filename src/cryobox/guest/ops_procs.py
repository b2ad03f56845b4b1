"""Background processes (E2B's process API): they outlive the request that started them.

``proc_start`` runs ``[cmd, *args]`` (no shell) in its own session and process group, on pipes or on a new
pseudo-terminal; its output is kept in a bounded log (see :mod:`.proc_io`). ``proc_start`` with ``attach``
and ``proc_connect`` stream: ``start`` (the pid in ASCII), ``dropped`` (ASCII byte count, only when output
was already discarded: before a replay, or when a slow follower fell behind), the output (``stdout`` and
``stderr``, or ``pty``; chunks of at most 64 KiB), then ``{pid, exit_code, status, exited: true}``; a
cancelled stream ends with ``{pid, detached: true}`` and the process runs on. Ended processes stay listed
(and connectable) for :data:`KEEP_EXITED_SECONDS`, at most the :data:`KEEP_EXITED` latest of them, except one
started attached with ``forget`` (the host's warm-ups), which goes once its stream has ended with it.
``exit_code`` and ``status`` follow Go's ProcessState: ``exit status N``, or ``-1`` and ``signal: killed``.

Processes are owned by a :class:`ProcTable` (one per agent), never by module state.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .launch import launch_context
from .ops_files import OpError, cancel_flag, decode_b64, invalid, optional_bool
from .ops_pty import _dimension, set_winsize
from .proc_io import POLL_MS, Proc, StartSpec, killpg, pump, spawn, write_all

Emit = Callable[[str, bytes], None]
Handler = Callable[[dict[str, Any], Emit], dict[str, Any]]

KEEP_EXITED = 64
KEEP_EXITED_SECONDS = 600.0
MAX_SIGNAL = 64


def parse_start(args: dict[str, Any]) -> StartSpec:
    cmd = args.get("cmd")
    if not isinstance(cmd, str) or not cmd or "\x00" in cmd:
        raise invalid("'cmd' must be a non-empty string")
    argv = args.get("args")
    if argv is None:
        argv = []
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        raise invalid("'args' must be a list of strings")
    tag = args.get("tag")
    if tag is not None and (not isinstance(tag, str) or not tag):
        raise invalid("'tag' must be a non-empty string or null")
    pty = args.get("pty")
    if pty is not None and not isinstance(pty, dict):
        raise invalid("'pty' must be an object {cols, rows} or null")
    launch = launch_context(args, term=pty is not None)
    return StartSpec(
        cmd=cmd,
        args=list(argv),
        env=launch.env,
        given_env=launch.given_env,
        cwd=launch.cwd,
        tag=tag,
        pty=None if pty is None else (_dimension(pty, "cols", 80), _dimension(pty, "rows", 24)),
        stdin=optional_bool(args, "stdin", False),
        attach=optional_bool(args, "attach", False),
        user=launch.user,
    )


class ProcTable:
    """The agent's background processes by pid (running and recently ended); op methods are handlers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # taken before a Proc's cond, never after
        self._procs: dict[int, Proc] = {}
        self._reserved_tags: set[str] = set()  # tags of processes being started

    def __len__(self) -> int:
        with self._lock:
            return len(self._procs)

    def handlers(self) -> dict[str, Handler]:
        return {
            "proc_start": self.op_start,
            "proc_connect": self.op_connect,
            "proc_list": self.op_list,
            "proc_input": self.op_input,
            "proc_signal": self.op_signal,
            "proc_resize": self.op_resize,
        }

    def kill_all(self) -> None:
        """SIGKILL every running process group (tests, shutdown)."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            with proc.cond:
                if not proc.reaping:
                    killpg(proc.pid, signal.SIGKILL)

    def _prune(self) -> None:  # with self._lock
        ended = sorted((p for p in self._procs.values() if p.done), key=lambda p: p.ended_at, reverse=True)
        horizon = time.monotonic() - KEEP_EXITED_SECONDS
        for n, proc in enumerate(ended):
            if n >= KEEP_EXITED or proc.ended_at < horizon:
                del self._procs[proc.pid]

    def _select(self, args: dict[str, Any]) -> Proc:
        pid, tag = args.get("pid"), args.get("tag")
        if (pid is None) == (tag is None):
            raise invalid("give exactly one of 'pid' or 'tag'")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
            raise invalid("'pid' must be an integer")
        if tag is not None and (not isinstance(tag, str) or not tag):
            raise invalid("'tag' must be a non-empty string")
        with self._lock:
            self._prune()
            if pid is not None:
                proc = self._procs.get(pid)
            else:  # the running one, else the latest to end
                tagged = [p for p in self._procs.values() if p.tag == tag]
                proc = max(tagged, key=lambda p: (not p.done, p.ended_at, p.started_at), default=None)
        if proc is None:
            raise OpError("not_found", f"no process {pid if pid is not None else tag!r}")
        return proc

    # --- ops -------------------------------------------------------------------------------------------

    def op_start(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        spec = parse_start(args)
        forget = optional_bool(args, "forget", False)  # the host's own warm-ups: not listed once they end
        if forget and not spec.attach:
            raise invalid("'forget' needs 'attach'")
        with self._lock:
            self._prune()
            if spec.tag is not None:
                if spec.tag in self._reserved_tags or any(
                    p.tag == spec.tag and not p.done for p in self._procs.values()
                ):
                    raise OpError("exists", f"a running process is tagged {spec.tag!r}")
                self._reserved_tags.add(spec.tag)
        try:
            proc = spawn(spec)
            with self._lock:
                self._procs[proc.pid] = proc  # a remembered ended process with this (recycled) pid is forgotten
        finally:
            if spec.tag is not None:
                with self._lock:
                    self._reserved_tags.discard(spec.tag)
        threading.Thread(target=pump, args=(proc,), name=f"cryobox-proc-{proc.pid}", daemon=True).start()
        if not spec.attach:
            return {"pid": proc.pid}
        result = self._follow(proc, emit)
        if forget and not result.get("detached"):
            with self._lock:
                if self._procs.get(proc.pid) is proc:
                    del self._procs[proc.pid]
        return result

    def op_connect(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        return self._follow(self._select(args), emit)

    def op_list(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        with self._lock:
            self._prune()
            procs = sorted(self._procs.values(), key=lambda p: p.started_at)
        infos = []
        for proc in procs:
            with proc.cond:
                infos.append(proc.info())
        return {"processes": infos}

    def op_input(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        proc = self._select(args)
        data = decode_b64(args.get("data", ""), "data")
        eof = optional_bool(args, "eof", False)
        if eof and proc.pty:
            raise invalid("a terminal has no end of input to send; send ^D (0x04) instead")
        with proc.write_lock:
            if proc.reaping or proc.done:
                raise OpError("not_found", f"process {proc.pid} has ended")
            fd = proc.master if proc.pty else (proc.stdin.fileno() if proc.stdin is not None else -1)
            if fd < 0:
                raise invalid(f"process {proc.pid} has no stdin (start it with stdin: true) or it was closed")
            written = write_all(fd, data) if data else 0
            if eof and proc.stdin is not None:
                proc.stdin.close()
                proc.stdin = None
        return {"written": written}

    def op_signal(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        proc = self._select(args)
        signum = args.get("signal")
        if isinstance(signum, bool) or not isinstance(signum, int) or not 1 <= signum <= MAX_SIGNAL:
            raise invalid(f"'signal' must be an integer from 1 to {MAX_SIGNAL}")
        with proc.cond:  # the pump cannot reap (and free the pid) meanwhile
            if proc.reaping or not killpg(proc.pid, signum):
                raise OpError("not_found", f"process {proc.pid} has ended")
        return {}

    def op_resize(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        proc = self._select(args)
        cols = _dimension(args, "cols", 80)
        rows = _dimension(args, "rows", 24)
        if not proc.pty:
            raise invalid(f"process {proc.pid} has no terminal")
        with proc.write_lock:
            if proc.master < 0:
                raise OpError("not_found", f"process {proc.pid} has ended")
            set_winsize(proc.master, cols, rows)
        return {"cols": cols, "rows": rows}

    def _follow(self, proc: Proc, emit: Emit) -> dict[str, Any]:
        """Stream ``start``, what the log still holds and live output; end at the exit or when cancelled."""
        cancelled = cancel_flag(emit)
        emit("start", str(proc.pid).encode())
        cursor = 0
        while True:
            with proc.cond:
                while not cancelled.is_set() and cursor >= proc.output.end and not proc.done:
                    proc.cond.wait(POLL_MS / 1000)
                pieces, cursor, skipped = proc.output.read(cursor)
                finished = proc.done and cursor >= proc.output.end
                final = proc.final()
            if skipped:
                emit("dropped", str(skipped).encode())
            for event, data in pieces:
                emit(event, data)
            if cancelled.is_set():
                return {"pid": proc.pid, "detached": True}
            if finished:
                return final
