"""The host agent behind the typed interface (:class:`cryobox.agentapi.Agent`): everything one host does.

The control plane never sees the objects here; it calls these methods with :mod:`cryobox.agentapi.models`
values (in-process through :class:`~cryobox.agentapi.InProcessAgent`, or over HTTP). Per-host concerns live
here: admission (bounded concurrent restores with a FIFO queue), the warm pools (in the service), idle tracking
(every request touches its sandbox; one in flight keeps it alive), snapshots on this host's disk and their copies
in the object store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from ... import __version__
from ...agentapi import models as am
from ...agentapi.interface import FILE_OPS
from ...agentapi.models_obs import LogPage, LogQuery, MetricSeries
from ...errors import InvalidArgument, NotFound
from ...image.specs import TemplateSpec
from ...util.encoding import b64, unb64
from ...util.proc import Progress
from ..guest.exec import ExecSpec
from ..host.startup import Host
from ..sandbox.admission import AdmissionController
from ..sandbox.lifecycle import UNCHANGED
from ..sandbox.sandbox import Sandbox, SandboxState
from ..templates.bake import Template
from .counters import CounterEndpoints
from .hibernations import HibernationEndpoints
from .info import host_memory_mib, sandbox_info, template_info
from .procs import ProcEndpoints
from .snapshots import SnapshotOps
from .volumes import VolumeEndpoints

log = logging.getLogger(__name__)


class TemplateBuilder(Protocol):
    """Builds and bakes a template (:func:`cryobox.agent.host.startup.prepare_template` with the host bound);
    a recipe build's step logs go to ``step_log`` as (step, level, line)."""

    def __call__(
        self, spec: TemplateSpec, progress: Progress, *, step_log: Callable[[str, str, str], None] | None = None
    ) -> Awaitable[Template]: ...


PTY_CALL_TIMEOUT_S = 30.0
MAX_EGRESS_LOG = 1000


class HostAgent(HibernationEndpoints, ProcEndpoints, VolumeEndpoints, CounterEndpoints):
    """One host's agent (implements :class:`cryobox.agentapi.Agent`; portable hibernation in the base class)."""

    def __init__(
        self,
        host: Host,
        admission: AdmissionController,
        *,
        name: str,
        url: str = "",
        memory_mib: int | None = None,
        vcpus: int | None = None,
        max_sandboxes: int = 256,
        builder: TemplateBuilder | None = None,
        metrics_sources: list[Callable[[], Awaitable[str]]] | None = None,
        isolation: str = "",
    ) -> None:
        self.host = host
        self.service = host.service
        self.admission = admission
        self.service.set_restore_gate(admission.slot)  # a wake restores like a create: it waits its turn
        self.name = name
        self.url = url
        self.boot_id = uuid.uuid4().hex
        self.memory_total_mib = memory_mib or host_memory_mib()
        self.vcpus_total = vcpus or os.cpu_count() or 1
        self.max_sandboxes = max_sandboxes
        self.builder = builder
        self.metrics_sources = list(metrics_sources or [])
        self.isolation = isolation
        self.snapshots = SnapshotOps(host, self.service.clock)

    # -- the host ------------------------------------------------------------------------------------------

    async def info(self) -> am.AgentInfo:
        return am.AgentInfo(
            name=self.name,
            version=__version__,
            accelerator=self.host.config.accel.value,
            boot_id=self.boot_id,
            url=self.url,
            isolation=self.isolation,
            jail=self.jail_info(),
        )

    def jail_info(self) -> dict[str, Any]:
        jail = self.host.jail
        info: dict[str, Any] = {"enabled": False} if jail is None else jail.describe()
        info["host_weakened"] = list(self.host.jail_weakened)
        if self.host.config.accel.value == "tcg":
            info["boundary"] = (
                "TCG: QEMU's instruction emulator is not a security boundary upstream (QEMU's security policy "
                "covers KVM guests); the jail (uid, namespaces, seccomp, cgroup) is what confines an escape"
            )
        else:
            info["boundary"] = "KVM: hardware virtualization, then the jail"
        return info

    async def capacity(self) -> am.Capacity:
        held = [s for s in self.service.sandboxes.values() if s.state is not SandboxState.HIBERNATED]
        return am.Capacity(
            vcpus_total=self.vcpus_total,
            memory_total_mib=self.memory_total_mib,
            max_sandboxes=self.max_sandboxes,
            vcpus_committed=sum(s.cpus for s in held),
            memory_committed_mib=sum(s.memory_mib for s in held),
            sandboxes=len(self.service.sandboxes),
            sandboxes_running=sum(1 for s in held if s.state is SandboxState.RUNNING),
            restores_in_flight=self.admission.running + self.admission.queue_depth,
            restores_peak=self.service.restoring_peak,
            max_concurrent_restores=self.admission.config.max_concurrent,
            admission_queue_depth=self.admission.queue_depth,
            prespawned=sum(pool.ready_count for pool in self.service.pools.values()),
            memory_pooled_mib=sum(
                pool.held_count * pool.template.machine.memory_mib for pool in self.service.pools.values()
            )
            + (self.host.snapshots.staging.reserved_bytes >> 20),
            templates_ready={name: t.generation for name, t in self.service.templates.items()},
            hot_images=sorted(await asyncio.to_thread(self._hot_keys)),
            local_snapshots=await asyncio.to_thread(self.host.snapshots.ids),
        )

    def _hot_keys(self) -> list[str]:
        root = self.host.hot.root
        if not root.is_dir():
            return []
        return [p.name for p in root.iterdir() if not p.name.startswith(".")]

    async def templates(self) -> list[am.TemplateInfo]:
        return [template_info(t) for t in self.service.templates.values()]

    async def metrics_text(self) -> bytes:
        parts: list[str] = []
        egress = [self.host.egress.metrics.text] if self.host.egress.metrics is not None else []
        observer = [self.host.observer.metrics_text] if self.host.observer is not None else []
        for source in [self.host.memserver.metrics_text, *egress, *observer, *self.metrics_sources]:
            try:
                parts.append(await source())
            except Exception as err:  # a scrape never fails because one source did
                log.warning("metrics source failed: %s", err)
        return "".join(parts).encode()

    # -- sandboxes -----------------------------------------------------------------------------------------

    def _info(self, sandbox: Sandbox) -> am.SandboxInfo:
        return sandbox_info(sandbox, self.service.clock())

    async def list_sandboxes(self) -> list[am.SandboxInfo]:
        return [self._info(s) for s in self.service.all()]

    async def create(self, spec: am.CreateSpec) -> am.SandboxInfo:
        volumes = self.volume_attaches(spec.volumes)  # 404 for an image not on this host, before queueing
        image = None
        if spec.from_snapshot is not None:
            image = await self.snapshots.restorable(spec.from_snapshot)  # 404 / import before queueing
        else:
            self.service.template(spec.template)  # 404 before queueing
        async with self.admission.slot():
            sandbox = await self.service.create(
                spec.template,
                from_snapshot=image,
                metadata=dict(spec.metadata),
                env=dict(spec.env),
                ttl_s=spec.ttl_s,
                persistent=spec.persistent,
                workspace_id=spec.workspace_id,
                egress=spec.egress,
                sandbox_id=spec.sandbox_id,
                volumes=volumes,
            )
        return self._info(sandbox)

    async def get(self, sandbox_id: str) -> am.SandboxInfo:
        return self._info(self.service.get(sandbox_id))

    async def delete(self, sandbox_id: str) -> None:
        with contextlib.suppress(NotFound):
            await self.service.delete(sandbox_id)

    async def pause(self, sandbox_id: str) -> am.SandboxInfo:
        return self._info(await self.service.pause(sandbox_id))

    async def resume(self, sandbox_id: str) -> am.SandboxInfo:
        return self._info(await self.service.resume(sandbox_id))

    async def hibernate(self, sandbox_id: str) -> am.SandboxInfo:
        return self._info(await self.service.hibernate(sandbox_id))

    async def wake(self, sandbox_id: str) -> am.SandboxInfo:
        return self._info(await self.service.wake(sandbox_id))

    async def set_lifecycle(self, sandbox_id: str, patch: am.LifecyclePatch) -> am.SandboxInfo:
        ttl_s: int | None | object = patch.ttl_s if patch.set_ttl else UNCHANGED
        return self._info(await self.service.set_lifecycle(sandbox_id, ttl_s=ttl_s, persistent=patch.persistent))

    async def set_network(self, sandbox_id: str, update: am.NetworkUpdate) -> am.SandboxInfo:
        return self._info(await self.service.set_network(sandbox_id, update.policy))

    async def egress_log(self, sandbox_id: str, limit: int | None = None) -> am.EgressLog:
        self.service.get(sandbox_id)  # 404 for a sandbox this agent does not hold
        if limit is not None and not 0 <= limit <= MAX_EGRESS_LOG:
            raise InvalidArgument(f"limit must be 0-{MAX_EGRESS_LOG}", details={"limit": limit})
        return self.host.egress.read_log(sandbox_id, limit)

    async def touch(self, sandbox_id: str) -> am.SandboxInfo:
        return self._info(self.service.touch(sandbox_id))

    async def sandbox_metrics(
        self, sandbox_id: str, start: float | None = None, end: float | None = None
    ) -> MetricSeries:
        self.service.get(sandbox_id)  # 404 for a sandbox this agent does not hold; never touched
        observer = self.host.observer
        if observer is None:
            return MetricSeries(sandbox_id=sandbox_id, interval_s=0.0, samples=[])
        return observer.series(sandbox_id, start, end)

    async def sandbox_logs(self, sandbox_id: str, query: LogQuery) -> LogPage:
        self.service.get(sandbox_id)
        observer = self.host.observer
        if observer is None:
            return LogPage(entries=[], next_offset=0)
        return observer.page(sandbox_id, query)

    # -- commands, files, terminals ------------------------------------------------------------------------

    @staticmethod
    def _spec(request: am.ExecRequest) -> ExecSpec:
        stdin = unb64(request.stdin_b64) if request.stdin_b64 is not None else None
        return ExecSpec(
            cmd=request.cmd,
            timeout_s=request.timeout_s,
            env=dict(request.env),
            cwd=request.cwd,
            stdin=stdin,
            user=request.user,
            default_user=request.default_user,
        )

    async def exec(self, sandbox_id: str, request: am.ExecRequest) -> am.ExecResult:
        async with self.service.busy(sandbox_id):
            result = await self.service.exec(sandbox_id, self._spec(request))
        return am.ExecResult(
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            duration_ms=result.duration_ms,
            timed_out=result.timed_out,
        )

    async def exec_stream(self, sandbox_id: str, request: am.ExecRequest) -> AsyncIterator[am.ExecEvent]:
        async with self.service.busy(sandbox_id):
            async for event in self.service.exec_stream(sandbox_id, self._spec(request)):
                if event.kind == "exit" and event.result is not None:
                    r = event.result
                    yield am.ExecEvent(
                        kind="exit",
                        result=am.ExecResult(
                            exit_code=r.exit_code,
                            stdout=r.stdout,
                            stderr=r.stderr,
                            duration_ms=r.duration_ms,
                            timed_out=r.timed_out,
                        ),
                    )
                    return
                if event.kind in ("stdout", "stderr"):
                    yield am.ExecEvent(kind=event.kind, text=event.text)  # type: ignore[arg-type]

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        async with self.service.busy(sandbox_id):
            return await self.service.read_file(sandbox_id, path)

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> am.WriteResult:
        async with self.service.busy(sandbox_id):
            result = await self.service.write_file(sandbox_id, path, data, user=user)
        return am.WriteResult(path=str(result.get("path", path)), bytes=int(result.get("bytes", len(data))))

    async def file_op(self, sandbox_id: str, op: str, path: str) -> am.FsReply:
        if op not in FILE_OPS:
            raise InvalidArgument(f"unknown file operation {op!r}", details={"op": op})
        async with self.service.busy(sandbox_id):
            return am.FsReply.from_guest(await self.service.file_op(sandbox_id, op, path))

    async def inspect_net(self, sandbox_id: str) -> am.NetInspection:
        async with self.service.busy(sandbox_id):
            return am.NetInspection.from_guest(await self.service.inspect_net(sandbox_id))

    async def pty_open(self, sandbox_id: str, request: am.PtyOpen) -> AsyncIterator[am.PtyEvent]:
        args: dict[str, object] = {"cols": request.cols, "rows": request.rows}
        if request.cmd:
            args["cmd"] = request.cmd
        async with self.service.busy(sandbox_id):
            _, guest = await self.service.guest(sandbox_id)
            async for event in guest.stream("pty_open", args):
                kind = event.get("event")
                if kind == "session":
                    yield am.PtyEvent(kind="session", text=unb64(event.get("data")).decode())
                elif kind == "output":
                    yield am.PtyEvent(kind="output", data_b64=str(event.get("data") or ""))
                elif kind == "result":
                    yield am.PtyEvent(kind="exit", exit_code=event["result"].get("exit_code"))

    async def _pty_call(self, sandbox_id: str, op: str, args: dict[str, object]) -> None:
        _, guest = await self.service.guest(sandbox_id)
        await guest.call(op, args, timeout=PTY_CALL_TIMEOUT_S)

    async def pty_input(self, sandbox_id: str, session: str, data: bytes) -> None:
        await self._pty_call(sandbox_id, "pty_input", {"session": session, "data": b64(data)})

    async def pty_resize(self, sandbox_id: str, session: str, cols: int, rows: int) -> None:
        await self._pty_call(sandbox_id, "pty_resize", {"session": session, "cols": cols, "rows": rows})

    async def pty_close(self, sandbox_id: str, session: str) -> None:
        await self._pty_call(sandbox_id, "pty_close", {"session": session})

    # -- snapshots and forks (agent/hostagent/snapshots.py) -------------------------------------------------------

    async def snapshot(self, sandbox_id: str, request: am.SnapshotRequest) -> am.SnapshotInfo:
        return await self.snapshots.take(sandbox_id, request)

    async def store_snapshot(self, snapshot_id: str) -> am.StoredSnapshot:
        return await self.snapshots.store(snapshot_id)

    async def delete_snapshot(self, snapshot_id: str, *, from_store: bool = False) -> None:
        await self.snapshots.delete(snapshot_id, from_store=from_store)

    async def prune_snapshots(self, keep: list[str]) -> list[str]:
        return await self.snapshots.prune(set(keep))

    async def fork(self, sandbox_id: str, request: am.ForkRequest) -> am.SandboxInfo:
        volumes, clones = self.fork_volumes({request.child_id: request.volumes})  # refused before anything is done
        # a child's boot holds an admission slot like any restore
        return self._info(await self.snapshots.fork(sandbox_id, request, self.admission.slot, volumes, clones))

    async def fork_tree(self, sandbox_id: str, request: am.TreeRequest) -> am.TreeResult:
        volumes, clones = self.fork_volumes(request.volumes)  # refused before anything is done
        return await self.snapshots.fork_tree(
            sandbox_id, request, self._info, slot=self.admission.slot, volumes=volumes, clones=clones
        )

    async def evidence_list(self, snapshot_id: str) -> list[am.EvidenceEntry]:
        return await self.snapshots.evidence_list(snapshot_id)

    async def evidence_read(self, snapshot_id: str, name: str) -> bytes:
        return await self.snapshots.evidence_read(snapshot_id, name)

    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int:
        return await self.snapshots.evidence_put(snapshot_id, name, data)

    # -- templates -----------------------------------------------------------------------------------------

    async def build_template(self, build: am.TemplateBuild) -> AsyncIterator[am.BuildEvent]:
        if self.builder is None:
            raise InvalidArgument("this agent cannot build templates")
        spec = build.spec.template_spec()
        lines: asyncio.Queue[am.BuildEvent] = asyncio.Queue(maxsize=10000)

        def progress(line: str) -> None:
            with contextlib.suppress(asyncio.QueueFull):  # progress is advisory: drop lines past the cap
                lines.put_nowait(am.BuildEvent(progress=line[:200]))

        def step_log(step: str, level: str, line: str) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                lines.put_nowait(am.BuildEvent(log=line[:4000], step=step, level=level))

        job: asyncio.Future[Template] = asyncio.ensure_future(self.builder(spec, progress, step_log=step_log))
        try:
            while not job.done():
                getter: asyncio.Future[am.BuildEvent] = asyncio.ensure_future(lines.get())
                waiting: set[asyncio.Future[object]] = {job, getter}  # type: ignore[arg-type]
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            while not lines.empty():  # what the build said last, before its result
                yield lines.get_nowait()
            try:
                template = job.result()
            except Exception as err:  # a failed build is reported as the stream's last event
                log.warning("template %s failed to build: %s", spec.name, err)
                step = getattr(err, "step", None) or ("finalize" if spec.recipe is not None else None)
                yield am.BuildEvent(error=str(err)[:4000], step=step, level="error")
                return
            replaced = self.service.templates.get(template.name)
            self.service.add_template(template)
            if replaced is not None and replaced.path != template.path and not self.service.uses_template(spec.name):
                # a rebuild: the previous generation's bake goes, as a delete's would (kept while sandboxes of
                # the name run, or a snapshot or hibernation builds on it)
                await asyncio.to_thread(self._remove_bake, replaced)
            yield am.BuildEvent(template=template_info(template))
        finally:
            if not job.done():
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job

    async def remove_template(self, name: str) -> None:
        template = self.service.templates.get(name)
        await self.service.remove_template(name)
        if template is not None and not self.service.uses_template(name):
            await asyncio.to_thread(self._remove_bake, template)

    def _remove_bake(self, template: Template) -> None:
        """Delete a removed template's bake from the image cache, unless a snapshot or hibernation here still
        builds on it (their disks are overlays of its disk)."""
        paths = self.host.config.paths
        for root in (paths.snapshots_dir, paths.hibernate_dir):
            for manifest in root.glob("*/manifest.json"):
                with contextlib.suppress(OSError):
                    if template.generation in manifest.read_text():
                        return
        shutil.rmtree(template.path, ignore_errors=True)
        log.info("removed the bake of template %s (%s)", template.name, template.path)
        rootfs = Path(str(template.manifest.get("rootfs", "")))
        if rootfs.parent.parent != paths.images_dir / "rootfs-recipe":
            return
        for manifest in paths.templates_dir.glob("*/manifest.json"):  # every bake on this host (any data dir)
            with contextlib.suppress(OSError):
                if str(rootfs) in manifest.read_text():
                    return
        shutil.rmtree(rootfs.parent, ignore_errors=True)  # a recipe's flattened image no bake uses any more

    async def close(self) -> None:
        """Nothing to release: the agent's owner stops the host (:meth:`Host.close`)."""
