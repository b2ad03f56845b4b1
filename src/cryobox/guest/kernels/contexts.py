"""Kernel contexts: one Jupyter kernel (ipykernel) per context, driven with jupyter_client's blocking client.

A context runs one cell at a time (a lock); its cell's output is read from the kernel's iopub channel and turned
into output lines (:mod:`.results`) as it comes. A per-call timeout *interrupts* the kernel (SIGINT: the cell gets
a ``KeyboardInterrupt``), so the context and its variables survive; so does a caller going away mid-cell.

Every kernel starts with :data:`STARTUP` (inline matplotlib, the seed tracking below) and, when ``warm``, with
numpy, pandas and matplotlib imported and one figure and one DataFrame rendered, so a first cell costs what a warm
kernel costs. Restores and forks of a snapshot share the kernels' RNG state; before a context's next cell after
its guest came back under a new instance id (``/run/cryobox/instance-id``, written by the agent's resume),
``random`` and ``numpy.random`` are reseeded from ``os.urandom`` unless the user seeded them themselves.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from jupyter_client.manager import KernelManager

from .results import error_line, lines_of

Emit = Callable[[dict[str, Any]], None]
INSTANCE_ID_PATH = "/run/cryobox/instance-id"
START_TIMEOUT_S = 180.0
POLL_S = 0.1
INTERRUPT_GRACE_S = 10.0
"""How long an interrupted cell may take to stop before the kernel is restarted (state lost, said so)."""

STARTUP = """
import builtins as __cb_builtins, random as __cb_random
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
import os as __cb_os
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
        self._lock = threading.Lock()
        self._km: KernelManager | None = None
        self._kc: Any = None
        self._runtime: str | None = None
        self.executions = 0

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> KernelContext:
        # unix sockets, not loopback TCP: a guest holding established TCP connections is not snapshotted as a
        # template (agent/quiesce.py), and a kernel's channels are the guest talking to itself anyway
        self._runtime = tempfile.mkdtemp(prefix="cryobox-kernel-")
        # jupyter_client 7.4 is not typed
        km = KernelManager(  # type: ignore[no-untyped-call]
            kernel_name="python3", transport="ipc", ip=os.path.join(self._runtime, "k")
        )
        km.start_kernel(cwd=self.cwd, env={**os.environ, **(self._env or {})})
        kc = km.blocking_client()  # type: ignore[no-untyped-call]
        kc.start_channels(hb=False)  # no heartbeat thread: a restore steps the clock, nothing else is needed
        try:
            kc.wait_for_ready(timeout=START_TIMEOUT_S)
        except RuntimeError as err:
            km.shutdown_kernel(now=True)
            raise ContextError(500, f"kernel did not start: {err}") from err
        self._km, self._kc = km, kc
        self._silent(STARTUP)
        if self.warm:
            self._silent(WARM)
        self._seen_instance = self._instance()
        return self

    def shutdown(self) -> None:
        with self._lock:
            if self._kc is not None:
                self._kc.stop_channels()
            if self._km is not None:
                self._km.shutdown_kernel(now=True)
            self._km = self._kc = None
            self._forget_runtime()

    def _forget_runtime(self) -> None:
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None

    def restart(self) -> None:
        """A fresh kernel (all state gone), warmed like the first."""
        with self._lock:
            self.restart_locked()

    def interrupt(self) -> None:
        if self._km is not None:
            self._km.interrupt_kernel()

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
        with self._lock:
            if self._kc is None:
                raise ContextError(409, f"context {self.id} has no kernel (it was removed)")
            current = self._instance()
            if current and current != self._seen_instance:  # a restore or fork child of a snapshot
                self._run(RESEED, lambda line: None, timeout_s=30, silent=True)
                self._seen_instance = current
            if env:
                self._run(f"import os; os.environ.update({env!r})", lambda line: None, timeout_s=30, silent=True)
            self._run(code, emit, timeout_s=timeout_s, alive=alive)
            self.executions += 1
            self._emit_safely(emit, {"type": "number_of_executions", "execution_count": self.executions})

    def _run(
        self,
        code: str,
        emit: Emit,
        *,
        timeout_s: float | None,
        silent: bool = False,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        kc = self._kc
        msg_id = kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        interrupted_at: float | None = None
        gone = False
        while True:
            try:
                message = kc.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                now = time.monotonic()
                if interrupted_at is None and ((deadline is not None and now > deadline) or (alive and not alive())):
                    gone = gone or (alive is not None and not alive())
                    self.interrupt()
                    interrupted_at = now
                elif interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                    self._emit_safely(emit, error_line("KernelRestarted", "the cell ignored the interrupt", []))
                    self.restart_locked()
                    return
                if self._km is not None and not self._km.is_alive():
                    self._emit_safely(emit, error_line("KernelDied", "the kernel process exited", []))
                    self.restart_locked()
                    return
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue  # an earlier (abandoned) cell's late output
            if message["msg_type"] == "status" and message["content"].get("execution_state") == "idle":
                return
            for line in lines_of(message):
                if interrupted_at is not None and deadline is not None and line["type"] == "error":
                    line = error_line("TimeoutError", f"execution timed out after {timeout_s:g}s (interrupted)", [])
                if gone:
                    continue
                try:
                    emit(line)
                except OSError:  # the caller went away: stop the cell, keep the context
                    gone = True
                    if interrupted_at is None:
                        self.interrupt()
                        interrupted_at = time.monotonic()

    @staticmethod
    def _emit_safely(emit: Emit, line: dict[str, Any]) -> None:
        try:
            emit(line)
        except OSError:
            pass

    def restart_locked(self) -> None:
        """Replace the kernel while holding the lock (a cell that would not stop, or a dead kernel)."""
        if self._kc is not None:
            self._kc.stop_channels()
        if self._km is not None:
            self._km.shutdown_kernel(now=True)
        self._km = self._kc = None
        self._forget_runtime()
        self.start()
