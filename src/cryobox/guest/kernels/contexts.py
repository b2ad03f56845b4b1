"""Kernel contexts: one kernel process (:mod:`.shell`, an IPython shell) per context.

Each context has one worker thread that owns its kernel's pipes and runs one job at a time: a cell, a restart, a
shutdown. A cell's output (the kernel's stdout and stderr, and its display/result/error messages) is turned into
output lines (:mod:`.results`) and handed, line by line, to the request thread that streams it. A per-call timeout
*interrupts* the kernel (SIGINT: the cell gets a ``KeyboardInterrupt``, reported as ``TimeoutError`` with
``timed_out: true``), so the context and its variables survive; so does a caller going away mid-cell, noticed when a
write fails or, while the cell is quiet, when ``alive`` says so. Removing or restarting a context interrupts a
running cell first.

Every kernel starts with :data:`STARTUP` (inline matplotlib, the seed tracking below) and, when ``warm``, with
numpy, pandas and matplotlib imported and one figure and one DataFrame rendered, so a first cell costs what a warm
kernel costs. Restores and forks of a snapshot share the kernels' RNG state; before a context's next cell after its
guest came back under a new instance id (``/run/cryobox/instance-id``, written by the agent's resume), ``random``
and ``numpy.random`` are reseeded from ``os.urandom`` unless the user seeded them (``random.seed`` and
``numpy.random.seed`` are wrapped to notice; numpy is imported at start in warm kernels, so its seed is tracked from
the start). ``env`` of a call applies to that call only.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .pipes import Pipes
from .results import error_line, result_line, stream_line

Emit = Callable[[dict[str, Any]], None]
INSTANCE_ID_PATH = "/run/cryobox/instance-id"
START_TIMEOUT_S = 180.0
POLL_S = 0.1
INTERRUPT_GRACE_S = 10.0
"""How long an interrupted cell may take to stop before the kernel is restarted (state lost, said so)."""
_DONE = object()

STARTUP = """
import builtins as __cb_builtins, random as __cb_random, os as __cb_os
get_ipython().run_line_magic("matplotlib", "inline")
__cb_builtins.__cryobox_user_seeded__ = False
def __cb_track(seed):
    def tracked(*args, **kwargs):
        __cb_builtins.__cryobox_user_seeded__ = True
        return seed(*args, **kwargs)
    tracked.__cryobox_original__ = seed
    return tracked
__cb_random.seed = __cb_track(__cb_random.seed)
def __cb_track_numpy():
    import sys
    np = sys.modules.get("numpy")
    if np is not None and not hasattr(np.random.seed, "__cryobox_original__"):
        np.random.seed = __cb_track(np.random.seed)
def __cb_env_set(values):
    saved = {key: __cb_os.environ.get(key) for key in values}
    __cb_os.environ.update(values)
    return saved
def __cb_env_restore(saved):
    for key, value in saved.items():
        if value is None:
            __cb_os.environ.pop(key, None)
        else:
            __cb_os.environ[key] = value
__cb_track_numpy()
"""
WARM = """
import numpy, pandas, matplotlib, matplotlib.pyplot as __cb_plt, io as __cb_io
__cb_track_numpy()
__cb_figure = __cb_plt.figure(); __cb_plt.plot([1, 2, 3]); __cb_figure.savefig(__cb_io.BytesIO(), format="png")
__cb_plt.close(__cb_figure); del __cb_figure
pandas.DataFrame({"a": [1, 2]})._repr_html_()
"""
RESEED = """
__cb_track_numpy()
if not __cb_builtins.__cryobox_user_seeded__:
    getattr(__cb_random.seed, "__cryobox_original__", __cb_random.seed)(__cb_os.urandom(32))
    import sys as __cb_sys
    __cb_np = __cb_sys.modules.get("numpy")
    if __cb_np is not None:
        getattr(__cb_np.random.seed, "__cryobox_original__", __cb_np.random.seed)(
            __cb_np.frombuffer(__cb_os.urandom(16), dtype=__cb_np.uint32))
"""


def instance_id(path: str = INSTANCE_ID_PATH) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


class ContextError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Cell:
    """A cell handed to the worker: what to run, and the lines it made (``_DONE`` last)."""

    code: str
    timeout_s: float | None
    env: dict[str, str]
    alive: Callable[[], bool] | None
    lines: queue.Queue[Any] = field(default_factory=queue.Queue)
    abandoned: threading.Event = field(default_factory=threading.Event)


class KernelContext:
    def __init__(
        self,
        language: str = "python",
        cwd: str = "/home/user",
        *,
        context_id: str | None = None,
        warm: bool = False,
        env: dict[str, str] | None = None,
        instance: Callable[[], str] = instance_id,
    ) -> None:
        if language != "python":
            raise ContextError(400, f"language {language!r} is not available (python is)")
        self.id = context_id or uuid.uuid4().hex[:12]
        self.language = language
        self.cwd = cwd if os.path.isdir(cwd) else "/"
        self.warm = warm
        self._env = env
        self._instance = instance
        self._seen_instance = instance()
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._stop_cell = threading.Event()  # a remove or restart wants the running cell gone
        self._proc: subprocess.Popen[bytes] | None = None
        self._cells: Any = None
        self._pipes: Pipes | None = None
        self._worker = threading.Thread(target=self._work, name=f"kernel-{self.id}", daemon=True)
        self.executions = 0

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # -- the worker thread -------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as err:  # never lose the worker; the job reported what it could
                print(f"cryobox kernels: context {self.id}: {err!r}", flush=True)

    def _call(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the worker thread and wait for it; its exception is raised here."""
        done = threading.Event()
        failure: list[BaseException] = []

        def wrapped() -> None:
            try:
                job()
            except BaseException as err:  # handed back to the caller
                failure.append(err)
            finally:
                done.set()

        self._jobs.put(wrapped)
        done.wait()
        if failure:
            raise failure[0]

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> KernelContext:
        if not self._worker.is_alive():
            self._worker.start()
        self._call(self._start)
        return self

    def _start(self) -> None:
        cells_r, cells_w = os.pipe()
        events_r, events_w = os.pipe()
        argv = [sys.executable, "-m", f"{__package__}.shell", "--in", str(cells_r), "--out", str(events_w)]
        env = {**os.environ, **(self._env or {}), "MPLBACKEND": "agg"}
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(cells_r, events_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=env,
                start_new_session=True,  # its own group: a shutdown also ends what the user's code left running
            )
        finally:
            os.close(cells_r)
            os.close(events_w)
        assert proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._cells = os.fdopen(cells_w, "w", buffering=1, encoding="utf-8")
        self._pipes = Pipes(events_r, proc.stdout.fileno(), proc.stderr.fileno())
        ready = self._pipes.next_event(START_TIMEOUT_S)
        if ready is None or ready.get("type") != "ready":
            self._stop()
            raise ContextError(500, f"kernel did not start (exit code {proc.poll()})")
        self._silent(STARTUP)
        if self.warm:
            self._silent(WARM)
        self._seen_instance = self._instance()

    def _stop(self) -> None:
        self._stop_cell.clear()  # the cell it was asked to stop is gone with the kernel
        proc, self._proc = self._proc, None
        if self._cells is not None:
            with contextlib.suppress(OSError):
                self._cells.close()
            self._cells = None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if self._pipes is not None:
            self._pipes.close()
            self._pipes = None

    def _interrupt(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGINT)

    def shutdown(self) -> None:
        """Stop the kernel (a running cell is interrupted first) and the worker."""
        self._stop_cell.set()
        if self._worker.is_alive():
            self._call(self._stop)
            self._jobs.put(None)
            self._worker.join(timeout=30)
        else:
            self._stop()

    def restart(self) -> None:
        """A fresh kernel (all state gone), warmed like the first; a running cell is interrupted first."""
        self._stop_cell.set()
        self._call(self._restart)

    def _restart(self) -> None:
        self._stop()
        self._start()

    # -- running cells -----------------------------------------------------------------------------------------

    def _silent(self, code: str) -> None:
        lines: list[dict[str, Any]] = []
        self._run(code, lines.append, timeout_s=START_TIMEOUT_S, silent=True)
        errors = [line for line in lines if line["type"] == "error"]
        if errors:
            raise ContextError(500, f"kernel set-up failed: {errors[0]['name']}: {errors[0]['value']}")

    def execute(
        self,
        code: str,
        emit: Emit,
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        """Run one cell, emitting its output lines and a last ``number_of_executions``; ``emit`` raising, or
        ``alive`` answering false while the cell is quiet (the caller went away), interrupts the cell."""
        cell = Cell(code, timeout_s, dict(env or {}), alive)
        self._jobs.put(lambda: self._cell(cell))
        while True:
            line = cell.lines.get()
            if line is _DONE:
                return
            if isinstance(line, ContextError):
                raise line
            if cell.abandoned.is_set():
                continue
            try:
                emit(line)
            except OSError:
                cell.abandoned.set()  # the worker interrupts the cell at its next look

    def _cell(self, cell: Cell) -> None:
        try:
            if self._proc is None:
                raise ContextError(409, f"context {self.id} has no kernel (it was removed)")
            self._stop_cell.clear()
            current = self._instance()
            if current and current != self._seen_instance:  # a restore or fork child of a snapshot
                self._run(RESEED, lambda line: None, timeout_s=30, silent=True)
                self._seen_instance = current
            if cell.env:
                self._run(f"__cb_env_saved = __cb_env_set({cell.env!r})", lambda line: None, timeout_s=30, silent=True)
            try:
                self._run(cell.code, cell.lines.put, timeout_s=cell.timeout_s, alive=cell.alive, cell=cell)
            finally:
                if cell.env and self._proc is not None:
                    self._run("__cb_env_restore(__cb_env_saved)", lambda line: None, timeout_s=30, silent=True)
            self.executions += 1
            cell.lines.put({"type": "number_of_executions", "execution_count": self.executions})
        except ContextError as err:
            cell.lines.put(err)
        except Exception as err:  # the kernel process or its pipes failed under the cell
            cell.lines.put(ContextError(500, f"the kernel failed: {type(err).__name__}: {err}"))
        finally:
            cell.lines.put(_DONE)

    def _run(
        self,
        code: str,
        emit: Emit,
        *,
        timeout_s: float | None,
        silent: bool = False,
        alive: Callable[[], bool] | None = None,
        cell: Cell | None = None,
    ) -> None:
        assert self._cells is not None and self._pipes is not None
        pipes = self._pipes
        try:
            self._cells.write(json.dumps({"code": code, "silent": silent}) + "\n")
            self._cells.flush()
        except OSError:
            emit(error_line("KernelDied", "the kernel process exited: the kernel was restarted", []))
            self._restart()
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        interrupted_at: float | None = None
        timed_out = False
        while True:
            now = time.monotonic()
            if interrupted_at is None:
                timed_out = deadline is not None and now > deadline
                gone = cell is not None and cell.abandoned.is_set()
                if timed_out or gone or self._stop_cell.is_set():
                    self._interrupt()
                    interrupted_at = now
            elif now - interrupted_at > INTERRUPT_GRACE_S:
                emit(error_line("KernelRestarted", "the cell ignored the interrupt: the kernel was restarted", []))
                self._restart()
                return
            for name, text in pipes.output():
                if not silent:
                    emit(stream_line(name, text))
            event = pipes.next_event(POLL_S, on_output=None if silent else lambda n, t: emit(stream_line(n, t)))
            if event is None:
                if pipes.closed:
                    emit(error_line("KernelDied", "the kernel process exited: the kernel was restarted", []))
                    self._restart()
                    return
                if cell is not None and alive is not None and interrupted_at is None and not alive():
                    cell.abandoned.set()
                continue
            kind = event.get("type")
            if kind == "done":
                for name, text in pipes.output():
                    if not silent:
                        emit(stream_line(name, text))
                return
            if kind in ("display", "result"):
                emit(result_line(dict(event.get("data") or {}), main=kind == "result"))
            elif kind == "error":
                name, value = str(event.get("ename")), str(event.get("evalue"))
                line = error_line(name, value, [str(t) for t in event.get("traceback") or []])
                if timed_out and name == "KeyboardInterrupt":
                    line = error_line("TimeoutError", f"execution timed out after {timeout_s:g}s (interrupted)", [])
                    line["timed_out"] = True
                emit(line)
