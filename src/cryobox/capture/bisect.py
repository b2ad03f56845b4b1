"""``cryobox bisect``: is a failure decided before or after a given machine state?

Fork the state ``count`` times (one memory+disk snapshot, ``count`` restores, each with fresh guest entropy)
and run the same command in every child at once. If the outcome was already decided in that state (a value
drawn and held in memory), every child agrees: 0 or ``count`` reproduce. If it is decided later (a draw
still to come), the children disagree and the ratio estimates the failure rate from that point.

A child *reproduces* when the command exits non-zero or runs past ``--timeout``. Children the fork tree
could not create, and children whose command could not be run at all, are listed separately and are not
part of the denominator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import CryoboxError, SandboxTimeout

SNAPSHOT_PREFIX = "snap-"


class ExecOutcome(Protocol):
    @property
    def exit_code(self) -> int: ...


class Child(Protocol):
    """What bisect needs from a fork-tree child (the SDK's ``Sandbox``)."""

    @property
    def id(self) -> str: ...

    def exec(self, cmd: str, *, timeout_seconds: float | None = ...) -> Any: ...

    def kill(self) -> None: ...


class Tree(Protocol):
    @property
    def snapshot_id(self) -> str: ...

    @property
    def children(self) -> Sequence[Child]: ...

    @property
    def errors(self) -> Sequence[Any]: ...


class Parent(Protocol):
    @property
    def id(self) -> str: ...

    def fork_tree(self, count: int = ...) -> Any: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ChildRun:
    id: str
    exit_code: int | None
    duration_ms: float
    timed_out: bool = False
    error: str | None = None  # the command could not be run (not counted)

    @property
    def counted(self) -> bool:
        return self.error is None

    @property
    def reproduced(self) -> bool:
        return self.counted and (self.timed_out or self.exit_code != 0)

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "id": self.id,
            "exit_code": self.exit_code,
            "duration_ms": round(self.duration_ms, 1),
            "reproduced": self.reproduced,
        }
        if self.timed_out:
            value["timed_out"] = True
        if self.error is not None:
            value["error"] = self.error
        return value


@dataclass
class BisectReport:
    target: str
    command: str
    requested: int
    runs: list[ChildRun]
    create_errors: list[str] = field(default_factory=list)  # children the fork tree could not create
    snapshot_id: str | None = None  # the fork tree's snapshot of the state

    @property
    def count(self) -> int:
        """The denominator: children that ran the command."""
        return sum(1 for r in self.runs if r.counted)

    @property
    def reproduced(self) -> int:
        return sum(1 for r in self.runs if r.reproduced)

    @property
    def verdict(self) -> str:
        if self.count == 0:
            return "no child ran the command"
        if self.reproduced in (0, self.count):
            return "all children agree: the outcome looks decided in this state"
        return "children disagree: the outcome is decided after this state"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "command": self.command,
            "requested": self.requested,
            "count": self.count,
            "reproduced": self.reproduced,
            "children": [r.to_json() for r in self.runs if r.counted],
            "failed_children": [r.to_json() for r in self.runs if not r.counted],
            "create_errors": self.create_errors,
            "snapshot_id": self.snapshot_id,
        }

    def render(self) -> str:
        lines = [f"{self.reproduced}/{self.count} reproduced ({self.verdict})"]
        width = max([len(r.id) for r in self.runs] + [5])
        lines.append(f"{'child':<{width}}  {'exit':>5}  {'ms':>9}  result")
        for run in self.runs:
            if not run.counted:
                continue
            exit_text = "-" if run.exit_code is None else str(run.exit_code)
            result = "timeout" if run.timed_out else ("reproduced" if run.reproduced else "passed")
            lines.append(f"{run.id:<{width}}  {exit_text:>5}  {run.duration_ms:>9.0f}  {result}")
        not_run = [r for r in self.runs if not r.counted]
        if not_run or self.create_errors:
            lines.append(
                f"not counted ({len(not_run) + len(self.create_errors)} of {self.requested} requested children; "
                "excluded from the denominator):"
            )
            lines.extend(f"  {r.id}: could not run the command: {r.error}" for r in not_run)
            lines.extend(f"  not created: {e}" for e in self.create_errors)
        return "\n".join(lines)


def run_child(child: Child, command: str, timeout_s: float | None) -> ChildRun:
    start = time.monotonic()
    try:
        result = child.exec(command, timeout_seconds=timeout_s)
    except SandboxTimeout:
        return ChildRun(child.id, None, (time.monotonic() - start) * 1000.0, timed_out=True)
    except CryoboxError as error:
        return ChildRun(child.id, None, (time.monotonic() - start) * 1000.0, error=f"{error.code}: {error.message}")
    duration = getattr(result, "duration_ms", None)
    if not isinstance(duration, int | float):
        duration = (time.monotonic() - start) * 1000.0
    return ChildRun(child.id, int(result.exit_code), float(duration))


def run_children(children: Sequence[Child], command: str, timeout_s: float | None) -> list[ChildRun]:
    """Run ``command`` in every child at once; results in the children's order."""
    if not children:
        return []
    with ThreadPoolExecutor(max_workers=len(children), thread_name_prefix="bisect") as pool:
        return list(pool.map(lambda c: run_child(c, command, timeout_s), children))


def kill_all(children: Sequence[Child]) -> list[str]:
    """Kill every child (concurrently); return the errors."""

    def kill(child: Child) -> str | None:
        try:
            child.kill()
        except CryoboxError as error:
            return f"{child.id}: {error.message}"
        return None

    if not children:
        return []
    with ThreadPoolExecutor(max_workers=len(children), thread_name_prefix="bisect-kill") as pool:
        return [e for e in pool.map(kill, children) if e is not None]


def _error_text(error: Any) -> str:
    index = getattr(error, "index", None)
    message = getattr(error, "error", error)
    return f"child {index}: {message}" if index is not None else str(message)


@dataclass
class BisectApi:
    """How bisect reaches the platform (replaced by fakes in tests)."""

    connect: Callable[[str], Parent]
    restore: Callable[[str], Parent]
    delete_snapshot: Callable[[str], None]


def sdk_api(api_url: str | None, api_key: str | None) -> BisectApi:
    from ..sdk import Sandbox, Snapshots

    def delete_snapshot(snapshot_id: str) -> None:
        with Snapshots(api_url=api_url, api_key=api_key) as snapshots:
            snapshots.delete(snapshot_id)

    return BisectApi(
        connect=lambda sandbox_id: Sandbox.connect(sandbox_id, api_url=api_url, api_key=api_key),
        restore=lambda snapshot_id: Sandbox.create(from_snapshot=snapshot_id, api_url=api_url, api_key=api_key),
        delete_snapshot=delete_snapshot,
    )


def bisect(
    target: str,
    command: str,
    api: BisectApi,
    *,
    count: int = 16,
    timeout_s: float | None = 300.0,
    progress: Callable[[str], None] | None = None,
) -> BisectReport:
    """Fork ``target`` (a sandbox id, or a snapshot id restored into a temporary sandbox) ``count`` times,
    run ``command`` in every child at once, kill the children (and the temporary sandbox), and report."""
    say = progress or (lambda line: None)
    temporary = target.startswith(SNAPSHOT_PREFIX)
    if temporary:
        say(f"restoring {target}")
        parent = api.restore(target)
    else:
        parent = api.connect(target)
    try:
        say(f"forking {parent.id} into {count} children")
        tree: Tree = parent.fork_tree(count)
        try:
            say(f"running the command in {len(tree.children)} children")
            runs = run_children(tree.children, command, timeout_s)
        finally:
            say("killing the children")
            kill_all(tree.children)
            try:
                api.delete_snapshot(tree.snapshot_id)
            except CryoboxError:
                pass  # the parent's snapshots go with it anyway
        return BisectReport(
            target=target,
            command=command,
            requested=count,
            runs=runs,
            create_errors=[_error_text(e) for e in tree.errors],
            snapshot_id=tree.snapshot_id,
        )
    finally:
        if temporary:
            say(f"killing the temporary sandbox {parent.id}")
            try:
                parent.kill()
            except CryoboxError:
                parent.close()
        else:
            parent.close()
