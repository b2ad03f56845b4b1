"""Progress reporting: the small interface library code reports through, and its renderers.

A :class:`Reporter` is also a plain ``Callable[[str], None]`` (:data:`cryobox.util.proc.Progress`): a free-form
line. On top, :meth:`Reporter.phase` opens a :class:`Phase` (a name, an optional total) that is advanced step by
step, given a transient note, and finished. Library code that was handed a plain callable gets a reporter for it
with :func:`as_reporter`. Phases may run side by side (templates bake concurrently): each is its own handle.

Renderers: :class:`RichReporter` (bars on a terminal, :mod:`rich.progress`), :class:`PlainReporter` (lines: for
logs, pipes and ``--json`` runs, throttled) and :class:`NullReporter`. :func:`open_reporter` picks one for a
console (stderr by convention: stdout stays for results and JSON).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

Clock = Callable[[], float]
PLAIN_EVERY_S = 2.0  # a plain phase prints its count or note at most this often (and always when it completes)


class Phase(Protocol):
    def advance(self, n: float = 1) -> None: ...
    def update(self, note: str) -> None: ...
    def finish(self) -> None: ...
    def __enter__(self) -> Phase: ...
    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class Reporter(Protocol):
    def __call__(self, line: str) -> None: ...
    def phase(self, name: str, total: float | None = None) -> Phase: ...


class _PhaseBase:
    """``with reporter.phase(...) as p:`` ends the phase however the block ends (as failed on an exception)."""

    def end(self, failed: bool) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        self.end(failed=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.end(failed=kind is not None)


def _count(value: float) -> str:
    return f"{value:g}"


class _PlainPhase(_PhaseBase):
    def __init__(self, owner: PlainReporter, name: str, total: float | None) -> None:
        self.owner, self.name, self.total = owner, name, total
        self.done = 0.0
        self.started = self.last = owner.clock()
        self.finished = False

    def _due(self) -> bool:
        now = self.owner.clock()
        if now - self.last >= self.owner.every_s:
            self.last = now
            return True
        return False

    def _count(self) -> str:
        return _count(self.done) + (f"/{_count(self.total)}" if self.total is not None else "")

    def advance(self, n: float = 1) -> None:
        with self.owner.lock:
            self.done += n
            if self.finished or not self._due():
                return
            line = f"{self.name}: {self._count()}"
        self.owner.write(line)

    def update(self, note: str) -> None:
        with self.owner.lock:
            if self.finished or not self._due():
                return
        self.owner.write(f"{self.name}: {note}")

    def end(self, failed: bool) -> None:
        with self.owner.lock:
            if self.finished:
                return
            self.finished = True
            elapsed = self.owner.clock() - self.started
            count = f" ({self._count()})" if self.done or self.total is not None else ""
        self.owner.write(f"{self.name}: {'failed after' if failed else 'done in'} {elapsed:.1f}s{count}")


class PlainReporter:
    """Lines through ``write``: a phase's start, its count or note at most every ``every_s`` seconds, and its
    end with the time it took and its count."""

    def __init__(self, write: Callable[[str], None], clock: Clock = time.monotonic, every_s: float = PLAIN_EVERY_S):
        self.write, self.clock, self.every_s = write, clock, every_s
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        self.write(line)

    def phase(self, name: str, total: float | None = None) -> Phase:
        self.write(f"{name} ..." if total is None else f"{name} ... (0/{_count(total)})")
        return _PlainPhase(self, name, total)


class _RichPhase(_PhaseBase):
    def __init__(self, owner: RichReporter, name: str, task: TaskID) -> None:
        self.owner, self.name, self.task = owner, name, task
        self.started = time.monotonic()
        self.finished = False

    def advance(self, n: float = 1) -> None:
        with self.owner.lock:
            if not self.finished:
                self.owner.bars.advance(self.task, n)

    def update(self, note: str) -> None:
        with self.owner.lock:
            if not self.finished:
                self.owner.bars.update(self.task, description=f"{escape(self.name)} [dim]{escape(note[:80])}")

    def end(self, failed: bool) -> None:
        with self.owner.lock:
            if self.finished:
                return
            self.finished = True
            self.owner.bars.remove_task(self.task)
        self.owner(f"{self.name}: {'failed after' if failed else 'done in'} {time.monotonic() - self.started:.1f}s")


class RichReporter:
    """Bars (a spinner where the total is unknown) with elapsed time, lines printed above them. Use it as a
    context manager (:func:`open_reporter` does): the bars are drawn between enter and exit."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.lock = threading.Lock()
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )

    def __call__(self, line: str) -> None:
        self.bars.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def phase(self, name: str, total: float | None = None) -> Phase:
        task = self.bars.add_task(escape(name), total=total)
        return _RichPhase(self, name, task)

    def __enter__(self) -> RichReporter:
        self.bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bars.stop()


class _NullPhase(_PhaseBase):
    def advance(self, n: float = 1) -> None:
        pass

    def update(self, note: str) -> None:
        pass

    def end(self, failed: bool) -> None:
        pass


class NullReporter:
    """Reports nothing."""

    def __call__(self, line: str) -> None:
        pass

    def phase(self, name: str, total: float | None = None) -> Phase:
        return _NullPhase()


class RoutedReporter:
    """Phases go to ``reporter``, free-form lines to ``lines`` (e.g. a filter that turns chatty lines into a
    phase's note)."""

    def __init__(self, reporter: Reporter, lines: Callable[[str], None]) -> None:
        self.reporter, self.lines = reporter, lines

    def __call__(self, line: str) -> None:
        self.lines(line)

    def phase(self, name: str, total: float | None = None) -> Phase:
        return self.reporter.phase(name, total)


def as_reporter(progress: Callable[[str], None]) -> Reporter:
    """``progress`` itself when it is a :class:`Reporter`, else a :class:`PlainReporter` writing through it."""
    if isinstance(progress, Reporter):
        return progress
    return PlainReporter(progress)


def wants_bars(console: Console, as_json: bool = False) -> bool:
    """Bars only on a terminal, and never for a ``--json`` run (its progress is plain lines)."""
    return console.is_terminal and not as_json


@contextmanager
def open_reporter(console: Console, *, as_json: bool = False, clock: Clock = time.monotonic) -> Iterator[Reporter]:
    """The reporter for ``console``: :class:`RichReporter` on a terminal, else :class:`PlainReporter` printing
    plain, unwrapped lines to it. Bars are cleared when the block ends."""
    if wants_bars(console, as_json):
        with RichReporter(console) as rich:
            yield rich
        return

    def write(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    yield PlainReporter(write, clock)
