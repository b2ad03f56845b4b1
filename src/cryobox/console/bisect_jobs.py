"""Bisect jobs: :func:`cryobox.capture.bisect.bisect` run by the control plane, for the console and the API.

``POST /v1/snapshots/{id}/bisect`` starts a job (202) that outlives its request: restore the snapshot into a
temporary sandbox, ``fork_tree(count)``, run the command in every child at once, kill the children and the
temporary sandbox, count. The logic is the CLI's own ``bisect()``; only its :class:`~cryobox.capture.bisect.BisectApi`
differs: instead of the SDK over HTTP (which would need the caller's plaintext key, which a console session
deliberately never holds), adapters call :class:`~cryobox.server.control.sandboxes.ControlPlane` and
:class:`~cryobox.server.control.forks.ForkControl` directly with the caller's workspace. ``bisect()`` is
synchronous (thread pools for the children); it runs in a worker thread and each adapter call hops onto the
event loop (``run_coroutine_threadsafe``).

Every sandbox a job makes carries ``cryobox.bisect_job=<id>`` in its metadata, and when the job ends whatever
still carries it is deleted (children are always cleaned up, whatever failed). A job is cancelled (the server
stops): commands in flight are abandoned, nothing new starts, the children are killed, the job ends ``failed``.
Jobs live on the replica that started them (an id asked of another replica is a 404), at most
``max_running`` (2) at once per workspace (429 ``rate_limited`` beyond) and the last ``keep`` (20) finished
ones per workspace are remembered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ..agentapi import models as am
from ..capture.bisect import BisectApi, BisectReport, Parent, bisect
from ..errors import CryoboxError, NotFound, QuotaExceeded, SandboxTimeout
from ..errors import JobCancelled as Cancelled
from .bisect_platform import JOB_LABEL, Platform

log = logging.getLogger(__name__)

MAX_RUNNING = 2
KEEP_FINISHED = 20
TEMP_TTL_MARGIN_S = 600
T = TypeVar("T")
State = Literal["running", "done", "failed"]


@dataclass
class BisectJob:
    id: str
    workspace_id: str
    snapshot_id: str
    command: str
    count: int
    timeout_s: float
    created_at: float
    state: State = "running"
    report: BisectReport | None = None
    error: str | None = None
    finished_at: float | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def to_json(self) -> dict[str, Any]:
        report = self.report
        counted = report.count if report is not None else 0
        reproduced = report.reproduced if report is not None else 0
        not_counted = (
            sum(1 for r in report.runs if not r.counted) + len(report.create_errors) if report is not None else 0
        )
        value: dict[str, Any] = {
            "id": self.id,
            "snapshot_id": self.snapshot_id,
            "state": self.state,
            "command": self.command,
            "count": self.count,
            "timeout_seconds": self.timeout_s,
            "reproduced": reproduced,
            "passed": counted - reproduced,
            "errors": not_counted,
            "ratio": round(reproduced / counted, 4) if counted else None,
            "error": self.error,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }
        if report is not None:
            value["verdict"] = report.verdict
            value["result"] = report.to_json()
        return value


class _Bridge:
    """Runs the control plane's coroutines from ``bisect()``'s threads, on the loop; cancellable."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancelled: threading.Event) -> None:
        self._loop = loop
        self._cancelled = cancelled
        self._lock = threading.Lock()
        self._inflight: set[concurrent.futures.Future[Any]] = set()

    def call(self, coro: Coroutine[Any, Any, T], *, cancellable: bool = False) -> T:
        if cancellable and self._cancelled.is_set():
            coro.close()
            raise Cancelled("the bisect job was cancelled")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        if cancellable:
            with self._lock:  # under the lock that cancel() holds: a cancel never misses a call in flight
                self._inflight.add(future)
                if self._cancelled.is_set():
                    future.cancel()
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise Cancelled("the bisect job was cancelled") from None
        finally:
            with self._lock:
                self._inflight.discard(future)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled.set()
            for future in self._inflight:
                future.cancel()


@dataclass
class _Child:
    id: str
    workspace_id: str
    bridge: _Bridge
    platform: Platform

    def exec(self, cmd: str, *, timeout_seconds: float | None = None) -> am.ExecResult:
        result = self.bridge.call(
            self.platform.exec(self.id, self.workspace_id, cmd, timeout_seconds or 60.0), cancellable=True
        )
        if result.timed_out:
            raise SandboxTimeout(f"command timed out after {timeout_seconds}s")
        return result

    def kill(self) -> None:
        self.bridge.call(self.platform.delete(self.id, self.workspace_id))


@dataclass
class _TreeError:
    index: int
    error: str


@dataclass
class _Tree:
    snapshot_id: str
    children: Sequence[_Child]
    errors: Sequence[_TreeError]


@dataclass
class _Parent:
    id: str
    job: BisectJob
    bridge: _Bridge
    platform: Platform

    def fork_tree(self, count: int = 16) -> _Tree:
        if self.job.cancel_event.is_set():
            raise Cancelled("the bisect job was cancelled")
        labels = {JOB_LABEL: self.job.id}
        snapshot_id, ids, errors = self.bridge.call(
            self.platform.fork_tree(self.id, self.job.workspace_id, count, labels)
        )
        children = [_Child(i, self.job.workspace_id, self.bridge, self.platform) for i in ids]
        return _Tree(snapshot_id, children, [_TreeError(i, e) for i, e in errors])

    def kill(self) -> None:
        self.bridge.call(self.platform.delete(self.id, self.job.workspace_id))

    def close(self) -> None:
        pass


def _api(job: BisectJob, bridge: _Bridge, platform: Platform) -> BisectApi:
    ttl = int(job.timeout_s) + TEMP_TTL_MARGIN_S  # a safety net: the temporary sandbox expires on its own

    def restore(snapshot_id: str) -> Parent:
        if job.cancel_event.is_set():
            raise Cancelled("the bisect job was cancelled")
        labels = {JOB_LABEL: job.id}
        sandbox_id = bridge.call(platform.restore(snapshot_id, job.workspace_id, labels, ttl))
        return _Parent(sandbox_id, job, bridge, platform)

    def connect(sandbox_id: str) -> Parent:
        raise NotFound("a bisect job starts from a snapshot")

    def delete_snapshot(snapshot_id: str) -> None:
        bridge.call(platform.delete_snapshot(snapshot_id, job.workspace_id))

    return BisectApi(connect=connect, restore=restore, delete_snapshot=delete_snapshot)


class BisectJobs:
    def __init__(
        self,
        platform: Platform,
        *,
        max_running: int = MAX_RUNNING,
        keep: int = KEEP_FINISHED,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._platform = platform
        self._max_running = max_running
        self._keep = keep
        self._clock = clock
        self._jobs: dict[str, BisectJob] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._bridges: dict[str, _Bridge] = {}
        self._closed = False

    def start(self, workspace_id: str, snapshot_id: str, command: str, count: int, timeout_s: float) -> BisectJob:
        if self._closed:
            raise Cancelled("the server is stopping")
        running = [j for j in self._jobs.values() if j.workspace_id == workspace_id and j.state == "running"]
        if len(running) >= self._max_running:
            raise QuotaExceeded(
                f"{len(running)} bisect jobs are already running in this workspace (at most {self._max_running})",
                retry_after_s=5.0,
                details={"running": [j.id for j in running], "limit": self._max_running},
            )
        job = BisectJob(
            id=f"bis_{secrets.token_hex(8)}",
            workspace_id=workspace_id,
            snapshot_id=snapshot_id,
            command=command,
            count=count,
            timeout_s=timeout_s,
            created_at=self._clock(),
        )
        self._jobs[job.id] = job
        bridge = _Bridge(asyncio.get_running_loop(), job.cancel_event)
        self._bridges[job.id] = bridge
        self._tasks[job.id] = asyncio.create_task(self._run(job, bridge), name=f"bisect {job.id}")
        self._forget_old(workspace_id)
        return job

    def get(self, job_id: str, workspace_id: str) -> BisectJob:
        job = self._jobs.get(job_id)
        if job is None or job.workspace_id != workspace_id:
            raise NotFound(f"bisect job {job_id} not found", details={"id": job_id})
        return job

    async def wait(self, job_id: str) -> None:
        task = self._tasks.get(job_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def _run(self, job: BisectJob, bridge: _Bridge) -> None:
        try:
            report = await asyncio.to_thread(
                bisect,
                job.snapshot_id,
                job.command,
                _api(job, bridge, self._platform),
                count=job.count,
                timeout_s=job.timeout_s,
            )
        except CryoboxError as err:
            job.state, job.error = "failed", f"{err.code}: {err.message}"
        except Exception as err:  # a bug must still end the job (and its cleanup below)
            log.exception("bisect job %s failed", job.id)
            job.state, job.error = "failed", f"internal: {type(err).__name__}: {err}"
        else:
            job.report = report
            if job.cancel_event.is_set():
                job.state, job.error = "failed", "cancelled: the bisect job was cancelled (the server stopped)"
            else:
                job.state = "done"
        finally:
            await self._sweep(job)
            job.finished_at = self._clock()
            self._tasks.pop(job.id, None)
            self._bridges.pop(job.id, None)

    async def _sweep(self, job: BisectJob) -> None:
        """Delete whatever the job made that is still there (a child a failure left behind)."""
        try:
            leftovers = await self._platform.labelled(job.workspace_id, {JOB_LABEL: job.id})
        except CryoboxError as err:
            log.warning("bisect job %s: could not list its sandboxes: %s", job.id, err.message)
            return
        for sandbox_id in leftovers:
            try:
                await self._platform.delete(sandbox_id, job.workspace_id)
            except CryoboxError as err:
                log.warning("bisect job %s: could not delete %s: %s", job.id, sandbox_id, err.message)

    def _forget_old(self, workspace_id: str) -> None:
        done = [j for j in self._jobs.values() if j.workspace_id == workspace_id and j.state != "running"]
        for job in sorted(done, key=lambda j: j.created_at)[: max(0, len(done) - self._keep)]:
            del self._jobs[job.id]

    async def close(self, timeout_s: float = 60.0) -> None:
        """Cancel every running job and wait (at most ``timeout_s``) until each has cleaned up."""
        self._closed = True
        for bridge in list(self._bridges.values()):
            bridge.cancel()
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
