"""``FakeAgent``: an in-memory :class:`cryobox.agentapi.Agent` with believable semantics, for unit tests of the
agent transports and of the control plane. State lives in plain dicts; every call is recorded in ``calls`` as
``(method, args)``; stored objects are returned as they are (no copies), so a leaky transport shows.
``fail_next[method] = exc`` makes the next call of ``method`` raise ``exc``.

Commands: ``echo TEXT``, ``exit N``, ``cat`` (stdin), ``env``; anything else prints itself. ``capacity`` raises
``HostUnavailable(retry_after_s=7)``, ``fail`` ``GuestError``. Streamed: three ``stdout`` events then ``exit``;
``fail-mid-stream`` / ``capacity-mid-stream`` raise after one event; ``forever`` yields until closed. Ended
streams (exec and terminals) land in ``closed_streams``.

Stored hibernations go to ``objects`` (an :class:`ObjectStore`, ``memory://`` unless given: share one between
fakes and a control plane for a fleet with one object store) as ``hibernations/<id>/manifest.json`` holding the
sandbox and its files, so ``wake_stored`` on another fake brings back the same sandbox. Like the real agent,
``store_hibernation`` and ``store_snapshot`` answer with the sha256 of the manifest bytes they stored, and
``wake_stored`` refuses (``IntegrityError``) a stored manifest whose bytes do not hash to ``manifest_sha256``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from cryobox.agent.observe.logbook import LogBook
from cryobox.agent.observe.rings import RingBounds
from cryobox.agentapi import models as m
from cryobox.agentapi.interface import FILE_OPS, MAX_FILE_BYTES
from cryobox.agentapi.models_obs import AgentCounters, LogPage, LogQuery, MetricSample, MetricSeries
from cryobox.errors import (
    CryoboxError,
    GuestError,
    HostUnavailable,
    IntegrityError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    StateError,
)
from cryobox.netpolicy import EgressPolicy
from cryobox.objstore.client import ObjectStore, open_store
from tests.support.fake_builds import FakeRecipeBuilds
from tests.support.fake_procs import FakeProcs
from tests.support.fake_volumes import FakeVolumes

DEFAULT_TEMPLATE = m.TemplateInfo(name="base", generation="g1", cpus=1, memory_mib=512, created_at=0.0)


def _net(ip: str | None, egress: EgressPolicy | None) -> m.NetInspection:
    """What ``inspect_net`` answers: the guest's keys, plus the fake's own ``ip`` and ``egress`` (the networks it
    allows, ``["*"]`` when none: extra keys, as a newer guest's would be)."""
    interfaces: list[dict[str, object]] = [{"name": "eth0", "mac": "02:00:00:00:00:01", "addresses": [f"{ip}/30"]}]
    allowed = list(egress.allow) if egress is not None and egress.allow else ["*"]
    return m.NetInspection.model_validate({"sockets": [], "interfaces": interfaces, "ip": ip, "egress": allowed})


class FakeAgent(FakeProcs, FakeRecipeBuilds, FakeVolumes):
    def __init__(
        self,
        *,
        name: str = "fake",
        max_sandboxes: int = 16,
        vcpus: int = 16,
        memory_mib: int = 32768,
        templates: list[m.TemplateInfo] | None = None,
        clock: Callable[[], float] = time.time,
        objects: ObjectStore | None = None,
    ) -> None:
        self.objects = objects if objects is not None else open_store("memory://")
        self.name, self.max_sandboxes, self.vcpus, self.memory_mib = name, max_sandboxes, vcpus, memory_mib
        self.clock = clock
        self.boot_id = uuid.uuid4().hex
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail_next: dict[str, Exception] = {}
        self.sandboxes: dict[str, m.SandboxInfo] = {}
        self.files: dict[str, dict[str, bytes]] = {}
        self.dirs: dict[str, set[str]] = {}
        self.snapshots: dict[str, m.SnapshotInfo] = {}
        self.snapshot_files: dict[str, dict[str, bytes]] = {}
        self.volumes: dict[str, int] = {}
        self.attached_here: set[str] = set()
        self.held: dict[str, list[str]] = {}
        """Sandbox id -> the volume ids it has attached here, in slot order (a hibernated one's VM writes none)."""
        self.failing_children: set[str] = set()
        """Fork and tree children whose boot or restore fails (``GuestError``)."""
        self.stored: set[str] = set()
        self.stored_manifests: dict[str, str] = {}
        """Snapshot id -> the sha256 of the manifest its store_snapshot "uploaded"."""
        self.evidence: dict[str, dict[str, bytes]] = {}
        self.template_infos: dict[str, m.TemplateInfo] = {t.name: t for t in templates or [DEFAULT_TEMPLATE]}
        self.net: dict[str, m.NetInspection] = {}
        self.egress_decisions: dict[str, list[m.EgressDecision]] = {}
        self.samples: dict[str, list[MetricSample]] = {}
        """What ``sandbox_metrics`` answers (a test puts samples there); oldest first."""
        self.herd = AgentCounters()
        """What ``counters`` answers (a test sets the figures)."""
        self.logbook = LogBook(RingBounds(1000, 1 << 20, 1 << 24))
        """What ``sandbox_logs`` pages through (the agent's real log book; a test adds lines)."""
        self.ptys: dict[str, tuple[str, asyncio.Queue[bytes | None]]] = {}
        self.pty_sizes: dict[str, tuple[int, int]] = {}
        self.closed_streams: list[str] = []
        self.closed = False
        self._ids = itertools.count(1)
        self._init_procs()
        self._init_builds()

    # -- helpers -------------------------------------------------------------------------------------------------

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        error = self.fail_next.pop(method, None)
        if error is not None:
            raise error

    def call_names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def _sandbox(self, sandbox_id: str) -> m.SandboxInfo:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise NotFound(f"no sandbox {sandbox_id}", details={"sandbox_id": sandbox_id}) from None

    def _update(self, sandbox_id: str, **changes: Any) -> m.SandboxInfo:
        info = self._sandbox(sandbox_id).model_copy(update=changes)
        now = self.clock()
        info = info.model_copy(update={"idle_s": max(0.0, now - info.last_active)})
        expires = None if info.persistent or info.ttl_s is None else info.last_active + info.ttl_s
        self.sandboxes[sandbox_id] = info.model_copy(update={"expires_at": expires})
        return self.sandboxes[sandbox_id]

    def _require(self, sandbox_id: str, *states: str) -> m.SandboxInfo:
        info = self._sandbox(sandbox_id)
        if info.state not in states:
            raise StateError(f"sandbox {sandbox_id} is {info.state}", state=info.state, required=" or ".join(states))
        return info

    def _guest(self, sandbox_id: str) -> m.SandboxInfo:
        """A request that needs the guest: a hibernated sandbox wakes, a paused one refuses; activity."""
        info = self._sandbox(sandbox_id)
        if info.state == "hibernated":
            info = self._update(sandbox_id, state="running")
        self._require(sandbox_id, "running")
        return self._update(sandbox_id, last_active=self.clock())

    def _new_sandbox(self, spec: m.CreateSpec, *, boot_mode: str = "restore") -> m.SandboxInfo:
        template = self.template_infos.get(spec.template)
        if template is None:
            raise NotFound(f"no template {spec.template}", details={"template": spec.template})
        if spec.sandbox_id in self.sandboxes:
            raise StateError(f"sandbox {spec.sandbox_id} exists", state="exists", required="absent")
        if len(self.sandboxes) >= self.max_sandboxes:
            raise HostUnavailable("the fake agent is full", retry_after_s=3.0, details={"agent": self.name})
        n = next(self._ids)
        now = self.clock()
        info = m.SandboxInfo(
            id=spec.sandbox_id,
            template=spec.template,
            cpus=template.cpus,
            memory_mib=template.memory_mib,
            state="running",
            workspace_id=spec.workspace_id,
            created_at=now,
            metadata=dict(spec.metadata),
            env=dict(spec.env),
            boot_mode="cold" if boot_mode == "cold" else "restore",
            boot_ms=5.0,
            from_snapshot=spec.from_snapshot.id if spec.from_snapshot else None,
            instance_id=uuid.uuid4().hex,
            guest_ip=f"10.0.{n // 250}.{n % 250 + 2}",
            vm_id=f"vm-{n}",
            ttl_s=spec.ttl_s,
            persistent=spec.persistent,
            last_active=now,
            egress=spec.egress,
        )
        self.sandboxes[spec.sandbox_id] = info
        self.held[spec.sandbox_id] = [v.volume_id for v in spec.volumes]
        source = self.snapshot_files.get(spec.from_snapshot.id, {}) if spec.from_snapshot else {}
        self.files[spec.sandbox_id] = dict(source)
        self.dirs[spec.sandbox_id] = {"/"}
        self.net[spec.sandbox_id] = _net(info.guest_ip, spec.egress)
        return self._update(spec.sandbox_id)

    # -- the host ------------------------------------------------------------------------------------------------

    async def info(self) -> m.AgentInfo:
        self._record("info")
        return m.AgentInfo(name=self.name, version="0.0.0-fake", accelerator="none", boot_id=self.boot_id)

    async def capacity(self) -> m.Capacity:
        self._record("capacity")
        live = [s for s in self.sandboxes.values() if s.state not in ("stopped", "hibernated")]
        return m.Capacity(
            vcpus_total=self.vcpus,
            memory_total_mib=self.memory_mib,
            max_sandboxes=self.max_sandboxes,
            vcpus_committed=sum(s.cpus for s in live),
            memory_committed_mib=sum(s.memory_mib for s in live),
            sandboxes=len(self.sandboxes),
            templates_ready={t.name: t.generation for t in self.template_infos.values()},
            local_snapshots=sorted(self.snapshots),
        )

    async def templates(self) -> list[m.TemplateInfo]:
        self._record("templates")
        return list(self.template_infos.values())

    async def counters(self) -> AgentCounters:
        self._record("counters")
        return self.herd

    async def metrics_text(self) -> bytes:
        self._record("metrics_text")
        return f"# TYPE cryobox_fake_sandboxes gauge\ncryobox_fake_sandboxes {len(self.sandboxes)}\n".encode()

    # -- sandboxes -----------------------------------------------------------------------------------------------

    async def list_sandboxes(self) -> list[m.SandboxInfo]:
        self._record("list_sandboxes")
        return list(self.sandboxes.values())

    async def create(self, spec: m.CreateSpec) -> m.SandboxInfo:
        self._record("create", spec)
        if spec.sandbox_id in self.sandboxes:  # a retried create names the same sandbox
            return self.sandboxes[spec.sandbox_id]
        ref = spec.from_snapshot
        if ref is not None and ref.id not in self.snapshots and not (ref.stored and ref.id in self.stored):
            raise NotFound(f"no snapshot {ref.id}", details={"snapshot_id": ref.id})
        if ref is not None and ref.id not in self.snapshots and ref.manifest_sha256 is not None:
            if self.stored_manifests.get(ref.id) != ref.manifest_sha256:  # "imported": checked like the real one
                raise IntegrityError("the stored manifest is not the pinned one", details={"id": ref.id})
        return self._new_sandbox(spec)

    async def get(self, sandbox_id: str) -> m.SandboxInfo:
        self._record("get", sandbox_id)
        return self._update(sandbox_id)

    async def delete(self, sandbox_id: str) -> None:
        self._record("delete", sandbox_id)
        self.sandboxes.pop(sandbox_id, None)
        self.held.pop(sandbox_id, None)
        self.files.pop(sandbox_id, None)
        self.dirs.pop(sandbox_id, None)
        self.net.pop(sandbox_id, None)

    async def pause(self, sandbox_id: str) -> m.SandboxInfo:
        self._record("pause", sandbox_id)
        return self._update(self._require(sandbox_id, "running").id, state="paused")

    async def resume(self, sandbox_id: str) -> m.SandboxInfo:
        self._record("resume", sandbox_id)
        return self._update(self._require(sandbox_id, "paused").id, state="running", last_active=self.clock())

    async def hibernate(self, sandbox_id: str) -> m.SandboxInfo:
        self._record("hibernate", sandbox_id)
        # idempotent, like the real one
        return self._update(self._require(sandbox_id, "running", "paused", "hibernated").id, state="hibernated")

    async def wake(self, sandbox_id: str) -> m.SandboxInfo:
        self._record("wake", sandbox_id)
        return self._update(
            self._require(sandbox_id, "hibernated", "running").id, state="running", last_active=self.clock()
        )

    async def store_hibernation(self, sandbox_id: str) -> m.StoredHibernation:
        self._record("store_hibernation", sandbox_id)
        info = self._require(sandbox_id, "hibernated")
        template = self.template_infos[info.template]
        files = {path: base64.b64encode(data).decode() for path, data in self.files[sandbox_id].items()}
        key = f"hibernations/{sandbox_id}"
        manifest = {
            "sandbox": info.model_dump(mode="json"),
            "files": files,
            "generation": template.generation,
            "volumes": self.held.get(sandbox_id, []),
        }
        data = json.dumps(manifest).encode()
        self.objects.put(f"{key}/manifest.json", data)
        return m.StoredHibernation(
            id=sandbox_id,
            store=self.objects.url,
            key=key,
            generation=template.generation,
            size_bytes=len(files),
            unique_bytes=len(files),
            shared_bytes=0,
            manifest_sha256=hashlib.sha256(data).hexdigest(),
        )

    async def wake_stored(self, spec: m.WakeSpec) -> m.SandboxInfo:
        self._record("wake_stored", spec)
        if spec.sandbox_id in self.sandboxes:  # a retried call wakes the one it made
            return self._update(spec.sandbox_id, state="running", last_active=self.clock())
        template = self.template_infos.get(spec.template)
        if template is None:
            raise NotFound(f"no template {spec.template}", details={"template": spec.template})
        try:
            data = self.objects.get(f"hibernations/{spec.sandbox_id}/manifest.json")
        except CryoboxError:
            raise NotFound(f"no stored hibernation of {spec.sandbox_id}", details={"id": spec.sandbox_id}) from None
        sha = hashlib.sha256(data).hexdigest()
        if spec.manifest_sha256 is not None and sha != spec.manifest_sha256:  # checked before it is parsed
            raise IntegrityError("the stored manifest is not the pinned one", details={"sha256": sha})
        manifest = json.loads(data)
        if manifest["generation"] != template.generation:
            raise StateError("the hibernation is of another generation", state="wrong_generation", required="same")
        if len(self.sandboxes) >= self.max_sandboxes:
            raise HostUnavailable("the fake agent is full", retry_after_s=3.0, details={"agent": self.name})
        missing = [v for v in manifest.get("volumes", []) if v not in self.volumes]
        if missing:  # the real agent's 409: the control plane moves them here first
            raise StateError(f"volumes {missing} are not on this host", state="elsewhere", required="here")
        self.held[spec.sandbox_id] = list(manifest.get("volumes", []))
        n = next(self._ids)
        now = self.clock()
        self.sandboxes[spec.sandbox_id] = m.SandboxInfo(
            id=spec.sandbox_id,
            template=spec.template,
            cpus=template.cpus,
            memory_mib=template.memory_mib,
            state="running",
            workspace_id=spec.workspace_id,
            created_at=spec.created_at,
            metadata=dict(spec.metadata),
            env=dict(spec.env),
            boot_mode=spec.boot_mode,
            from_snapshot=spec.from_snapshot,
            instance_id=spec.instance_id,
            guest_ip=f"10.1.{n // 250}.{n % 250 + 2}",
            vm_id=f"vm-{self.name}-{n}",
            ttl_s=spec.ttl_s,
            persistent=spec.persistent,
            last_active=now,
            egress=spec.egress,
        )
        self.files[spec.sandbox_id] = {p: base64.b64decode(d) for p, d in manifest["files"].items()}
        self.dirs[spec.sandbox_id] = {"/"}
        self.net[spec.sandbox_id] = _net(f"10.1.0.{n}", spec.egress)
        return self._update(spec.sandbox_id)

    async def set_lifecycle(self, sandbox_id: str, patch: m.LifecyclePatch) -> m.SandboxInfo:
        self._record("set_lifecycle", sandbox_id, patch)
        info = self._sandbox(sandbox_id)
        ttl = patch.ttl_s if patch.set_ttl else info.ttl_s
        persistent = info.persistent if patch.persistent is None else patch.persistent
        return self._update(sandbox_id, ttl_s=ttl, persistent=persistent, last_active=self.clock())

    async def set_network(self, sandbox_id: str, update: m.NetworkUpdate) -> m.SandboxInfo:
        """Stores the policy of a running or paused sandbox; a hibernated one is refused (``wrong_state``), so the
        control plane's path that keeps the change for the wake is the one its tests see."""
        self._record("set_network", sandbox_id, update)
        self._require(sandbox_id, "running", "paused", "starting")
        info = self._update(sandbox_id, egress=update.policy)
        self.net[sandbox_id] = _net(info.guest_ip, update.policy)
        return info

    async def egress_log(self, sandbox_id: str, limit: int | None = None) -> m.EgressLog:
        """An empty log (the fake has no egress proxy); ``egress_decisions[id]`` when a test put some there."""
        self._record("egress_log", sandbox_id, limit)
        self._sandbox(sandbox_id)
        items = self.egress_decisions.get(sandbox_id, [])
        keep = len(items) if limit is None else min(limit, len(items))
        kept = items[len(items) - keep :]
        return m.EgressLog(items=kept, dropped=len(items) - len(kept))

    async def sandbox_metrics(
        self, sandbox_id: str, start: float | None = None, end: float | None = None
    ) -> MetricSeries:
        self._record("sandbox_metrics", sandbox_id, start, end)
        self._sandbox(sandbox_id)
        kept = [
            s
            for s in self.samples.get(sandbox_id, [])
            if (start is None or s.timestamp >= start) and (end is None or s.timestamp <= end)
        ]
        return MetricSeries(sandbox_id=sandbox_id, interval_s=5.0, samples=kept)

    async def sandbox_logs(self, sandbox_id: str, query: LogQuery) -> LogPage:
        self._record("sandbox_logs", sandbox_id, query)
        self._sandbox(sandbox_id)
        return self.logbook.page(sandbox_id, query)

    async def touch(self, sandbox_id: str) -> m.SandboxInfo:
        self._record("touch", sandbox_id)
        return self._update(sandbox_id, last_active=self.clock())

    # -- commands, files, terminals ------------------------------------------------------------------------------

    def _run(self, info: m.SandboxInfo, request: m.ExecRequest) -> m.ExecResult:
        cmd = request.cmd.strip()
        if cmd == "capacity":
            raise HostUnavailable("no capacity for this command", retry_after_s=7, details={"agent": self.name})
        if cmd.startswith("fail"):
            raise GuestError("the guest agent vanished", details={"sandbox_id": info.id})
        code, out, err = 0, f"{cmd}\n", ""
        if cmd.startswith("echo "):
            out = cmd[5:] + "\n"
        elif cmd.startswith("exit "):
            code, out, err = int(cmd[5:]), "", f"exited {cmd[5:]}\n"
        elif cmd == "cat":
            out = base64.b64decode(request.stdin_b64 or "").decode(errors="replace")
        elif cmd == "env":
            out = "".join(f"{k}={v}\n" for k, v in sorted({**info.env, **request.env}.items()))
        return m.ExecResult(exit_code=code, stdout=out, stderr=err, duration_ms=1.0)

    async def exec(self, sandbox_id: str, request: m.ExecRequest) -> m.ExecResult:
        self._record("exec", sandbox_id, request)
        return self._run(self._guest(sandbox_id), request)

    async def exec_stream(self, sandbox_id: str, request: m.ExecRequest) -> AsyncIterator[m.ExecEvent]:
        self._record("exec_stream", sandbox_id, request)
        info = self._guest(sandbox_id)
        cmd = request.cmd.strip()
        if cmd == "capacity":
            self._run(info, request)  # raises before the first event
        stream_id = f"exec-{next(self._ids)}"
        self._update(sandbox_id, in_flight=info.in_flight + 1)
        try:
            if cmd == "forever":
                for i in itertools.count():
                    yield m.ExecEvent(kind="stdout", text=f"tick {i}\n")
                    await asyncio.sleep(0.01)
            if cmd.endswith("-mid-stream"):
                yield m.ExecEvent(kind="stdout", text="starting\n")
                self._run(info, m.ExecRequest(cmd=cmd.removesuffix("-mid-stream")))  # capacity or fail: raises
                raise GuestError("the guest agent vanished mid-stream", details={"sandbox_id": sandbox_id})
            result = self._run(info, request)
            for i in range(3):
                yield m.ExecEvent(kind="stdout", text=f"{cmd} {i}\n")
                await asyncio.sleep(0)
            yield m.ExecEvent(kind="exit", result=result)
        finally:
            self.closed_streams.append(stream_id)
            if sandbox_id in self.sandboxes:
                self._update(sandbox_id, in_flight=max(0, self.sandboxes[sandbox_id].in_flight - 1))

    def _path(self, path: str) -> str:
        if not path.startswith("/") or "\x00" in path:
            raise InvalidArgument("path must be absolute", details={"path": path})
        return path.rstrip("/") or "/"

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        self._record("read_file", sandbox_id, path)
        self._guest(sandbox_id)
        try:
            return self.files[sandbox_id][self._path(path)]
        except KeyError:
            raise NotFound(f"no file {path}", details={"path": path}) from None

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> m.WriteResult:
        self._record("write_file", sandbox_id, path, len(data))
        self._guest(sandbox_id)
        if len(data) > MAX_FILE_BYTES:
            raise PayloadTooLarge(
                f"file of {len(data)} bytes exceeds {MAX_FILE_BYTES}", details={"limit": MAX_FILE_BYTES}
            )
        self.files[sandbox_id][self._path(path)] = bytes(data)
        return m.WriteResult(path=path, bytes=len(data))

    def _entry(self, sandbox_id: str, path: str) -> dict[str, object]:
        data = self.files[sandbox_id].get(path)
        if data is None and path not in self._dirs(sandbox_id):
            raise NotFound(f"no such file or directory: {path}", details={"path": path})
        size, is_dir = (0, True) if data is None else (len(data), False)
        return {"name": path.rsplit("/", 1)[-1] or "/", "is_dir": is_dir, "size": size, "mode": 0o644, "mtime": 0.0}

    def _dirs(self, sandbox_id: str) -> set[str]:
        """Made with ``mkdir``, plus every parent of a file."""
        parents = {p.rsplit("/", i)[0] or "/" for p in self.files[sandbox_id] for i in range(1, p.count("/") + 1)}
        return self.dirs[sandbox_id] | parents

    async def file_op(self, sandbox_id: str, op: str, path: str) -> m.FsReply:
        self._record("file_op", sandbox_id, op, path)
        return m.FsReply.model_validate(self._file_op(sandbox_id, op, path))

    def _file_op(self, sandbox_id: str, op: str, path: str) -> dict[str, object]:
        self._guest(sandbox_id)
        if op not in FILE_OPS:
            raise InvalidArgument(f"unknown file op {op!r}", details={"ops": sorted(FILE_OPS)})
        path, files, dirs = self._path(path), self.files[sandbox_id], self.dirs[sandbox_id]
        if op == "mkdir":
            dirs.add(path)
            return {"path": path}
        entry, prefix = self._entry(sandbox_id, path), path.rstrip("/") + "/"
        if op == "stat":
            return {**entry, "path": path}
        if op == "delete":
            for p in [p for p in files if p == path or p.startswith(prefix)]:
                del files[p]
            self.dirs[sandbox_id] = {d for d in dirs if d != path and not d.startswith(prefix)}
            return {}
        if not entry["is_dir"]:
            raise InvalidArgument(f"{path} is not a directory", details={"path": path})
        below = {
            p[len(prefix) :].split("/", 1)[0] for p in files.keys() | self._dirs(sandbox_id) if p.startswith(prefix)
        }
        listed = sorted(prefix + child for child in below if child)
        return {"path": path, "entries": [self._entry(sandbox_id, p) for p in listed]}

    async def inspect_net(self, sandbox_id: str) -> m.NetInspection:
        self._record("inspect_net", sandbox_id)
        self._guest(sandbox_id)
        return self.net[sandbox_id]

    async def pty_open(self, sandbox_id: str, request: m.PtyOpen) -> AsyncIterator[m.PtyEvent]:
        self._record("pty_open", sandbox_id, request)
        info = self._guest(sandbox_id)
        session = f"pty-{next(self._ids)}"
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.ptys[session] = (sandbox_id, queue)
        self.pty_sizes[session] = (request.cols, request.rows)
        self._update(sandbox_id, in_flight=info.in_flight + 1)
        try:
            yield m.PtyEvent(kind="session", text=session)
            if request.cmd:
                yield m.PtyEvent(kind="output", data_b64=base64.b64encode(f"{request.cmd}\r\n".encode()).decode())
            while (data := await queue.get()) is not None:
                yield m.PtyEvent(kind="output", data_b64=base64.b64encode(data).decode())
            yield m.PtyEvent(kind="exit", exit_code=0)
        finally:
            self.ptys.pop(session, None)
            self.closed_streams.append(session)
            if sandbox_id in self.sandboxes:
                self._update(sandbox_id, in_flight=max(0, self.sandboxes[sandbox_id].in_flight - 1))

    def _pty(self, sandbox_id: str, session: str) -> asyncio.Queue[bytes | None]:
        self._sandbox(sandbox_id)
        owner, queue = self.ptys.get(session, ("", None))
        if queue is None or owner != sandbox_id:
            raise NotFound(f"no terminal session {session}", details={"session": session})
        return queue

    async def pty_input(self, sandbox_id: str, session: str, data: bytes) -> None:
        self._record("pty_input", sandbox_id, session, data)
        self._pty(sandbox_id, session).put_nowait(bytes(data))

    async def pty_resize(self, sandbox_id: str, session: str, cols: int, rows: int) -> None:
        self._record("pty_resize", sandbox_id, session, cols, rows)
        self._pty(sandbox_id, session)
        self.pty_sizes[session] = (cols, rows)

    async def pty_close(self, sandbox_id: str, session: str) -> None:
        """Ends the terminal's program (the stream then yields ``exit``); idempotent."""
        self._record("pty_close", sandbox_id, session)
        self._sandbox(sandbox_id)
        if session in self.ptys and self.ptys[session][0] == sandbox_id:
            self.ptys[session][1].put_nowait(None)

    # -- snapshots and forks -------------------------------------------------------------------------------------

    def _take_snapshot(self, sandbox_id: str, request: m.SnapshotRequest) -> m.SnapshotInfo:
        if request.snapshot_id in self.snapshots:
            return self.snapshots[request.snapshot_id]
        info = self._sandbox(sandbox_id)
        if info.state == "hibernated":
            info = self._update(sandbox_id, state="running")
        self._require(sandbox_id, "running", "paused")
        files = dict(self.files[sandbox_id])
        template = self.template_infos.get(info.template)
        memory = info.memory_mib * 1024 * 1024
        shared = memory * 3 // 4  # the pages the guest left as its parent image has them
        snap = m.SnapshotInfo(
            id=request.snapshot_id,
            template=info.template,
            generation=template.generation if template else None,
            sandbox_id=sandbox_id,
            parent_id=info.from_snapshot,
            size_bytes=memory + sum(len(d) for d in files.values()),
            unique_bytes=memory - shared + sum(len(d) for d in files.values()),
            shared_bytes=shared,
            pause_ms=2.0,
            created_at=self.clock(),
            labels=dict(request.labels),
            path=f"/var/lib/cryobox/snapshots/{request.snapshot_id}",
        )
        self.snapshots[snap.id] = snap
        self.snapshot_files[snap.id] = files
        return snap

    async def snapshot(self, sandbox_id: str, request: m.SnapshotRequest) -> m.SnapshotInfo:
        self._record("snapshot", sandbox_id, request)
        return self._take_snapshot(sandbox_id, request)

    async def store_snapshot(self, snapshot_id: str) -> m.StoredSnapshot:
        self._record("store_snapshot", snapshot_id)
        if snapshot_id not in self.snapshots and snapshot_id not in self.stored:
            raise NotFound(f"no snapshot {snapshot_id}", details={"snapshot_id": snapshot_id})
        self.stored.add(snapshot_id)
        if snapshot_id not in self.stored_manifests:
            files = {k: base64.b64encode(v).decode() for k, v in self.snapshot_files.get(snapshot_id, {}).items()}
            data = json.dumps({"id": snapshot_id, "files": files}, sort_keys=True).encode()
            self.stored_manifests[snapshot_id] = hashlib.sha256(data).hexdigest()
        return m.StoredSnapshot(
            id=snapshot_id,
            store="memory://fake",
            key=f"snapshots/{snapshot_id}/",
            manifest_sha256=self.stored_manifests[snapshot_id],
        )

    async def delete_snapshot(self, snapshot_id: str, *, from_store: bool = False) -> None:
        self._record("delete_snapshot", snapshot_id, from_store)
        self.snapshots.pop(snapshot_id, None)
        self.evidence.pop(snapshot_id, None)
        if from_store:
            self.stored.discard(snapshot_id)
            self.stored_manifests.pop(snapshot_id, None)
            self.snapshot_files.pop(snapshot_id, None)

    async def prune_snapshots(self, keep: list[str]) -> list[str]:
        self._record("prune_snapshots", keep)
        removed = sorted(s for s in self.snapshots if s not in set(keep))
        for snapshot_id in removed:
            del self.snapshots[snapshot_id]
        return removed

    def _child(
        self, parent: m.SandboxInfo, child_id: str, metadata: dict[str, str], ref: m.SnapshotRef | None = None
    ) -> m.CreateSpec:
        return m.CreateSpec(
            sandbox_id=child_id,
            template=parent.template,
            workspace_id=parent.workspace_id,
            from_snapshot=ref,
            metadata=metadata,
            env=dict(parent.env),
            egress=parent.egress,  # a child keeps its parent's network policy, as the real agent's do
        )

    async def fork(self, sandbox_id: str, request: m.ForkRequest) -> m.SandboxInfo:
        self._record("fork", sandbox_id, request)
        parent = self._require(sandbox_id, "running", "paused")
        clones = self._clone_volumes(request.volumes)
        try:
            child = self._new_child(self._child(parent, request.child_id, dict(request.metadata)), boot_mode="cold")
        except CryoboxError:
            self._drop_clones(clones)
            raise
        self.files[child.id] = dict(self.files[sandbox_id])
        return child

    def _new_child(self, spec: m.CreateSpec, *, boot_mode: str = "restore") -> m.SandboxInfo:
        if spec.sandbox_id in self.failing_children:
            raise GuestError(f"child {spec.sandbox_id} did not come up")
        return self._new_sandbox(spec, boot_mode=boot_mode)

    async def fork_tree(self, sandbox_id: str, request: m.TreeRequest) -> m.TreeResult:
        self._record("fork_tree", sandbox_id, request)
        parent = self._sandbox(sandbox_id)
        snap = self._take_snapshot(sandbox_id, m.SnapshotRequest(snapshot_id=request.snapshot_id))
        children: list[m.SandboxInfo] = []
        errors: list[m.TreeChildError] = []
        for child_id in request.child_ids:
            metadata = {**request.metadata, "cryobox.tree_id": request.tree_id, "cryobox.parent_id": sandbox_id}
            ref = m.SnapshotRef(id=snap.id, template=snap.template)
            clones = self._clone_volumes(request.volumes.get(child_id, []))
            try:
                children.append(self._new_child(self._child(parent, child_id, metadata, ref)))
            except CryoboxError as exc:
                self._drop_clones(clones)
                errors.append(m.TreeChildError(child_id=child_id, error=f"{exc.code}: {exc.message}"))
        return m.TreeResult(snapshot=snap, children=children, errors=errors)

    def _snapshot_evidence(self, snapshot_id: str) -> dict[str, bytes]:
        if snapshot_id not in self.snapshots:
            raise NotFound(f"no snapshot {snapshot_id}", details={"snapshot_id": snapshot_id})
        return self.evidence.setdefault(snapshot_id, {})

    async def evidence_list(self, snapshot_id: str) -> list[m.EvidenceEntry]:
        self._record("evidence_list", snapshot_id)
        items = self._snapshot_evidence(snapshot_id)
        return [m.EvidenceEntry(name=n, size=len(d), source="put") for n, d in sorted(items.items())]

    async def evidence_read(self, snapshot_id: str, name: str) -> bytes:
        self._record("evidence_read", snapshot_id, name)
        try:
            return self._snapshot_evidence(snapshot_id)[name]
        except KeyError:
            raise NotFound(f"no evidence {name} for {snapshot_id}", details={"name": name}) from None

    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int:
        self._record("evidence_put", snapshot_id, name, len(data))
        if len(data) > MAX_FILE_BYTES:
            raise PayloadTooLarge(f"evidence of {len(data)} bytes exceeds {MAX_FILE_BYTES}")
        self._snapshot_evidence(snapshot_id)[name] = bytes(data)
        return len(data)

    # -- templates -----------------------------------------------------------------------------------------------

    async def build_template(self, build: m.TemplateBuild) -> AsyncIterator[m.BuildEvent]:
        self._record("build_template", build)
        name = build.spec.name
        if not name:
            raise InvalidArgument("a template build needs a name", details={"field": "name"})
        if build.spec.recipe is not None:
            async for event in self._recipe_build(build.spec):
                yield event
            return
        for step in ("resolving packages", "building rootfs", "baking snapshot"):
            yield m.BuildEvent(progress=f"{name}: {step}")
            await asyncio.sleep(0)
        if name == "fail-build":
            yield m.BuildEvent(error="step 2 failed: exit 1")
            return
        info = m.TemplateInfo(
            name=name,
            generation=f"g{next(self._ids)}",
            cpus=build.spec.cpus,
            memory_mib=build.spec.memory_mib,
            created_at=self.clock(),
        )
        self.template_infos[name] = info
        yield m.BuildEvent(template=info)

    async def remove_template(self, name: str) -> None:
        self._record("remove_template", name)
        if name not in self.template_infos:
            raise NotFound(f"no template {name}", details={"template": name})
        in_use = sorted(s.id for s in self.sandboxes.values() if s.template == name)
        if in_use:
            raise StateError(f"template {name} is in use", state="in_use", required="unused", details={"by": in_use})
        del self.template_infos[name]

    async def close(self) -> None:
        self._record("close")
        self.closed = True
