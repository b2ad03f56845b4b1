"""Resume hooks: user code the agent runs every time a sandbox comes back from a snapshot.

A restored guest is right about its own past and wrong about the world: its clock, cached names,
random state and open connections all date from the snapshot. The ``resume`` op fixes what the agent
can fix and then runs the hooks users register here. Drop a Python file into ``/etc/cryobox/resume.d/``::

    from cryobox_guest import on_resume

    @on_resume(order="connections")
    def reconnect_db(ctx):
        pool.reset()  # ctx == {"instance_id": "...", "clock_step_ns": 12345, "order": "connections"}

    on_resume(lambda ctx: print("ready"), name="announce")  # plain call, order "readiness"

Hooks run once per resume, by order (:data:`ORDER`), then by file name, then by registration within a
file. Each runs in its own thread with a timeout (:data:`DEFAULT_TIMEOUT`, or ``timeout=`` per hook);
an exception or a timeout is a failure that the host reports to its caller. A timed-out hook thread is
not killed (Python cannot), it is abandoned and keeps running in the background.

**How registration reaches the agent.** Every hook file is executed afresh with :func:`runpy.run_path`
at each resume, so a hook is registered (and runs) exactly once per resume. While a file runs, the
loading thread's *current registry* (:data:`_CURRENT`, a :class:`contextvars.ContextVar` and the only
module-level mutable state here) points at a fresh :class:`HookRegistry`; :func:`on_resume` appends to
it. Because the variable is context-local, a file still running after its load timed out cannot leak
registrations into a later load. Outside a load (e.g. a user importing their hook file to test it)
:func:`on_resume` registers nothing and just returns the function.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import runpy
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, overload

ORDER = ("clock", "names", "identity", "connections", "readiness")
"""Hook orders, in the order the ``resume`` op runs them (each right after the agent's own step):

* ``clock``: CLOCK_REALTIME was just stepped to the host's time (timers, caches keyed on wall time);
* ``names``: the neighbour table and resolver caches were flushed (re-resolve hostnames);
* ``identity``: the kernel RNG was reseeded and the instance id written (regenerate ids, nonces, keys);
* ``connections``: re-open sockets to the outside world;
* ``readiness``: last; the sandbox is reported ready once these finish.
"""
DEFAULT_ORDER = "readiness"
LOAD_ORDER = "load"  # the ``order`` reported for a hook file that failed to load
HOOKS_DIR = "/etc/cryobox/resume.d"
DEFAULT_TIMEOUT = 30.0  # seconds per hook (and per hook file load)
RUN_NAME = "cryobox_resume_hook"  # ``__name__`` of a hook file while it runs

HookFn = Callable[[dict[str, Any]], object]
F = TypeVar("F", bound=HookFn)


@dataclass(frozen=True)
class Hook:
    fn: HookFn
    order: str
    name: str
    timeout: float | None  # None: the runner's default


@dataclass(frozen=True)
class HookResult:
    name: str
    order: str
    ok: bool
    error: str | None
    ms: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "order": self.order, "ok": self.ok, "error": self.error, "ms": self.ms}


class HookRegistry:
    """Hooks registered while loading hook files. ``source`` (a file name) prefixes default hook names."""

    def __init__(self, source: str | None = None) -> None:
        self.source = source
        self._hooks: list[Hook] = []
        self._lock = threading.Lock()

    def add(
        self, fn: HookFn, *, order: str = DEFAULT_ORDER, name: str | None = None, timeout: float | None = None
    ) -> Hook:
        if not callable(fn):
            raise TypeError(f"a resume hook must be callable, got {fn!r}")
        if order not in ORDER:
            raise ValueError(f"unknown resume hook order {order!r}; expected one of {', '.join(ORDER)}")
        if name is None:
            base = getattr(fn, "__name__", None) or type(fn).__name__
            name = f"{self.source}:{base}" if self.source else str(base)
        elif not isinstance(name, str) or not name:
            raise ValueError("a resume hook name must be a non-empty string")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise TypeError("a resume hook timeout must be a number of seconds")
            if math.isnan(timeout) or timeout <= 0:
                raise ValueError("a resume hook timeout must be positive")
            timeout = float(timeout)
        hook = Hook(fn=fn, order=order, name=name, timeout=timeout)
        with self._lock:
            self._hooks.append(hook)
        return hook

    def extend(self, other: HookRegistry) -> None:
        hooks = other.hooks()
        with self._lock:
            self._hooks.extend(hooks)

    def hooks(self, order: str | None = None) -> list[Hook]:
        with self._lock:
            return [h for h in self._hooks if order is None or h.order == order]

    def __len__(self) -> int:
        with self._lock:
            return len(self._hooks)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[HookRegistry]:
        """Make this the current registry of the calling thread (context) while the block runs."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


_CURRENT: ContextVar[HookRegistry | None] = ContextVar("cryobox_resume_registry", default=None)


def current_registry() -> HookRegistry | None:
    """The registry :func:`on_resume` appends to right now (None outside a hook file load)."""
    return _CURRENT.get()


@overload
def on_resume(fn: F, *, order: str = ..., name: str | None = ..., timeout: float | None = ...) -> F: ...


@overload
def on_resume(
    fn: None = None, *, order: str = ..., name: str | None = ..., timeout: float | None = ...
) -> Callable[[F], F]: ...


def on_resume(
    fn: F | None = None, *, order: str = DEFAULT_ORDER, name: str | None = None, timeout: float | None = None
) -> F | Callable[[F], F]:
    """Register ``fn(ctx)`` to run on every resume; usable as ``on_resume(fn)`` or ``@on_resume(...)``.

    ``order`` is one of :data:`ORDER`; ``name`` defaults to ``"<file>:<function>"``; ``timeout`` (seconds)
    overrides the default per-hook timeout. Invalid arguments raise at registration, which makes the hook
    file fail to load (reported as a failed hook). Returns ``fn`` unchanged.
    """

    def register(func: F) -> F:
        registry = _CURRENT.get()
        if registry is None:
            # Outside a hook file load: validate like a load would, but keep nothing.
            HookRegistry().add(func, order=order, name=name, timeout=timeout)
        else:
            registry.add(func, order=order, name=name, timeout=timeout)
        return func

    if fn is None:
        return register
    return register(fn)


def call_with_timeout(fn: Callable[[], object], timeout: float | None) -> str | None:
    """Run ``fn`` in a daemon thread; None if it returned in time, else an error message."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # SystemExit from a hook is a failure too
            outcome.append(err)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name="cryobox-resume-hook", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"timed out after {timeout:g} s"
    err = outcome[0]
    if err is None:
        return None
    return f"{type(err).__name__}: {err}"


def hook_files(directory: str) -> list[str]:
    """Paths of the ``*.py`` files (not hidden, regular) in ``directory``, sorted by name; [] if missing."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    paths = []
    for name in sorted(names):
        path = os.path.join(directory, name)
        if name.endswith(".py") and not name.startswith(".") and os.path.isfile(path):
            paths.append(path)
    return paths


def load_hook_file(path: str, timeout: float | None = DEFAULT_TIMEOUT) -> tuple[HookRegistry, HookResult | None]:
    """Execute one hook file into a fresh registry. On failure the registry is empty and a failed
    :class:`HookResult` (order :data:`LOAD_ORDER`, named after the file) says why."""
    source = os.path.basename(path)
    registry = HookRegistry(source)

    def load() -> None:
        with registry.collecting():
            runpy.run_path(path, run_name=RUN_NAME)

    start = time.perf_counter()
    error = call_with_timeout(load, timeout)
    if error is None:
        return registry, None
    ms = round((time.perf_counter() - start) * 1000, 3)
    return HookRegistry(source), HookResult(name=source, order=LOAD_ORDER, ok=False, error=error, ms=ms)


def load_hooks(directory: str, timeout: float | None = DEFAULT_TIMEOUT) -> tuple[HookRegistry, list[HookResult]]:
    """Load every hook file of ``directory`` (sorted by name) into one fresh registry."""
    registry = HookRegistry()
    failures: list[HookResult] = []
    for path in hook_files(directory):
        loaded, failure = load_hook_file(path, timeout)
        registry.extend(loaded)
        if failure is not None:
            failures.append(failure)
    return registry, failures


def run_hooks(
    registry: HookRegistry, order: str, context: dict[str, Any], default_timeout: float | None = DEFAULT_TIMEOUT
) -> list[HookResult]:
    """Run the hooks of one order one after another; every hook gets its own copy of ``context``."""
    results = []
    for hook in registry.hooks(order):
        ctx = {**context, "order": order}
        timeout = hook.timeout if hook.timeout is not None else default_timeout
        start = time.perf_counter()
        error = call_with_timeout(functools.partial(hook.fn, ctx), timeout)
        ms = (time.perf_counter() - start) * 1000
        results.append(HookResult(name=hook.name, order=order, ok=error is None, error=error, ms=round(ms, 3)))
    return results
