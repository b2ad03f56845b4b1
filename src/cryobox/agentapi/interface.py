"""The typed interface between the control plane and a host agent, and the table every transport is derived from.

The control plane decides *where* and *whether* (auth, quotas, placement, the registry); an agent decides *how*
on its host (admission, warm pools, network slots, QEMU, snapshots, idle tracking). Every call crosses this
protocol with the plain values of :mod:`.models`; errors cross as the :mod:`cryobox.errors` tree (on HTTP as
``{"error", "code", "details"}`` with the code's status, rebuilt into the same class on the other side).

Each method's decorator says how it crosses the agent's HTTP API (route, query parameters, body limit, reply
form, timeout: :mod:`.operations`); :data:`OPERATIONS` reads them back. From that one table come
:class:`~.inprocess.InProcessAgent` (``cryobox serve``: one process), :class:`~.http_client.HttpAgent` and the
routes of :func:`~.http_server.create_agent_app` (``cryobox agent``). Adding an operation is a decorated
method here and its implementation in the agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol, runtime_checkable

from ..errors import InvalidArgument
from ..proxy.target import PortTarget
from . import operations as op
from .models import (
    AgentInfo,
    BuildEvent,
    Capacity,
    CreateSpec,
    EgressLog,
    EvidenceEntry,
    ExecEvent,
    ExecRequest,
    ExecResult,
    ForkRequest,
    FsReply,
    LifecyclePatch,
    NetInspection,
    NetworkUpdate,
    PtyEvent,
    PtyOpen,
    SandboxInfo,
    SnapshotInfo,
    SnapshotRequest,
    StoredHibernation,
    StoredSnapshot,
    TemplateBuild,
    TemplateInfo,
    TreeRequest,
    TreeResult,
    WakeSpec,
    WriteResult,
)
from .models_obs import AgentCounters, LogPage, LogQuery, MetricSeries
from .models_procs import (
    FsEvent,
    FsRequest,
    ProcEvent,
    ProcInfo,
    ProcInput,
    ProcResize,
    ProcSelector,
    ProcSignal,
    ProcStart,
    WatchRequest,
)
from .models_volumes import StoredVolume, VolumeFetch, VolumeInfo, VolumeResize, VolumeSpec

FILE_OPS = frozenset({"delete", "list_dir", "stat", "mkdir"})
MAX_FILE_BYTES = 64 << 20
"""The largest file (or evidence) body an agent accepts, on either transport; the guest enforces the same limit."""
MAX_PTY_INPUT_BYTES = 1 << 20
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GUEST_PATH = op.Query(min_length=1, max_length=4096, description="absolute path inside the guest")
GUEST_USER = op.Query(min_length=1, max_length=64, description="the guest user to own what is written")
EGRESS_LIMIT = op.Query(max_length=6, description="at most this many of the newest decisions (0-1000)")
SAMPLE_TIME = op.Query(description="epoch seconds")
LONG, NONE, EXEC = op.Timeout.LONG, op.Timeout.NONE, op.Timeout.EXEC


def _known_file_op(arguments: Mapping[str, object]) -> None:
    """The agent's HTTP face refuses an unknown file op before the agent sees it."""
    if arguments["op"] not in FILE_OPS:
        raise InvalidArgument(f"unknown file op {arguments['op']!r}", details={"ops": sorted(FILE_OPS)})


@runtime_checkable
class Agent(Protocol):
    """One host agent. Every method may raise a :class:`~cryobox.errors.CryoboxError`; sandbox-scoped ones
    raise ``NotFound`` for an id the agent does not hold. A hibernated sandbox is woken by any request that
    needs its guest (exec, files, terminals, snapshot, fork)."""

    # -- the host ------------------------------------------------------------------------------------------
    @op.get("/info")
    async def info(self) -> AgentInfo: ...

    @op.get("/capacity")
    async def capacity(self) -> Capacity: ...

    @op.get("/templates")
    async def templates(self) -> list[TemplateInfo]: ...

    @op.get("/metrics", media_type=METRICS_MEDIA_TYPE)
    async def metrics_text(self) -> bytes:
        """The agent's own Prometheus series (memory server, admission), text exposition format."""
        ...

    @op.get("/counters")
    async def counters(self) -> AgentCounters:
        """The host's herd counters (its memory server's), typed: what the control plane gathers from every
        agent for ``/metrics``, the console and ``cryobox top``. ``HostUnavailable`` when the memory server does
        not answer."""
        ...

    # -- sandboxes -----------------------------------------------------------------------------------------
    @op.get("/sandboxes")
    async def list_sandboxes(self) -> list[SandboxInfo]: ...

    @op.post("/sandboxes")
    async def create(self, spec: CreateSpec) -> SandboxInfo:
        """Restore a sandbox (admission-controlled: ``HostUnavailable`` when the agent's queue is full)."""
        ...

    @op.get("/sandboxes/{sandbox_id}")
    async def get(self, sandbox_id: str) -> SandboxInfo: ...

    @op.delete("/sandboxes/{sandbox_id}")
    async def delete(self, sandbox_id: str) -> None:
        """Kill the sandbox and free its slot; idempotent (an unknown id is not an error)."""
        ...

    @op.post("/sandboxes/{sandbox_id}/pause")
    async def pause(self, sandbox_id: str) -> SandboxInfo: ...

    @op.post("/sandboxes/{sandbox_id}/resume")
    async def resume(self, sandbox_id: str) -> SandboxInfo: ...

    @op.post("/sandboxes/{sandbox_id}/hibernate")
    async def hibernate(self, sandbox_id: str) -> SandboxInfo: ...

    @op.post("/sandboxes/{sandbox_id}/wake")
    async def wake(self, sandbox_id: str) -> SandboxInfo: ...

    @op.post("/hibernations/{sandbox_id}/store", timeout=LONG)
    async def store_hibernation(self, sandbox_id: str) -> StoredHibernation:
        """Copy a hibernated sandbox's image to the object store (idempotent; ``StateError`` unless hibernated),
        so another agent can wake it (:meth:`wake_stored`)."""
        ...

    @op.post("/hibernations/{sandbox_id}/wake", timeout=LONG)  # the segment is the body's sandbox_id
    async def wake_stored(self, spec: WakeSpec) -> SandboxInfo:
        """Import a stored hibernation (its overlay rebased onto this host's copy of the template's disk) and wake
        it here as the same sandbox; admission-controlled like a create. A retried call wakes the one it made."""
        ...

    @op.patch("/sandboxes/{sandbox_id}/lifecycle")
    async def set_lifecycle(self, sandbox_id: str, patch: LifecyclePatch) -> SandboxInfo:
        """Change TTL/persistence; counts as activity (the idle clock restarts)."""
        ...

    @op.put("/sandboxes/{sandbox_id}/network")
    async def set_network(self, sandbox_id: str, update: NetworkUpdate) -> SandboxInfo:
        """Replace the sandbox's network policy: new connections see it at once, open ones it denies are cut."""
        ...

    @op.get("/sandboxes/{sandbox_id}/egress", query={"limit": EGRESS_LIMIT})
    async def egress_log(self, sandbox_id: str, limit: int | None = None) -> EgressLog:
        """The sandbox's newest egress decisions (at most ``limit``), oldest first."""
        ...

    @op.get("/sandboxes/{sandbox_id}/metrics", query={"start": SAMPLE_TIME, "end": SAMPLE_TIME})
    async def sandbox_metrics(
        self, sandbox_id: str, start: float | None = None, end: float | None = None
    ) -> MetricSeries:
        """The sandbox's CPU and memory samples taken in ``[start, end]`` (either open), oldest first. Never wakes
        the sandbox, never counts as activity."""
        ...

    @op.post("/sandboxes/{sandbox_id}/logs")
    async def sandbox_logs(self, sandbox_id: str, query: LogQuery) -> LogPage:
        """A page of the sandbox's log (its console and the agent's lines about it). Never wakes the sandbox,
        never counts as activity."""
        ...

    # -- volumes -------------------------------------------------------------------------------------------
    @op.get("/volumes")
    async def list_volumes(self) -> list[VolumeInfo]:
        """The volume images this agent holds."""
        ...

    @op.post("/volumes/{volume_id}")  # the segment is the body's volume_id
    async def create_volume(self, spec: VolumeSpec) -> VolumeInfo:
        """Make a volume's image (an ext4 file system on a sparse file); a retried call answers the one it made."""
        ...

    @op.get("/volumes/{volume_id}")
    async def volume_info(self, volume_id: str) -> VolumeInfo: ...

    @op.post("/volumes/{volume_id}/resize")
    async def resize_volume(self, volume_id: str, request: VolumeResize) -> VolumeInfo:
        """Grow the image (the guest grows its file system when it next mounts it); smaller is a 400."""
        ...

    @op.delete("/volumes/{volume_id}")
    async def delete_volume(self, volume_id: str) -> None:
        """Remove the image (idempotent; 409 while a sandbox of this host has it attached). A move's source
        removes its copy with it once the target holds the volume."""
        ...

    @op.post("/volumes/{volume_id}/store", timeout=LONG)
    async def store_volume(self, volume_id: str) -> StoredVolume:
        """Upload the detached image to the object store (``volumes/<id>/``: the chunks the store lacks, the index,
        the manifest last); 409 while a sandbox of this host has it attached, 404 when it is not here."""
        ...

    @op.post("/volumes/{volume_id}/fetch", timeout=LONG)  # the segment is the body's volume_id
    async def fetch_volume(self, request: VolumeFetch) -> VolumeInfo:
        """Materialize the stored image here, atomically, once its manifest matches the registry's pin
        (``IntegrityError`` otherwise, nothing installed); replaces a stale copy (409 while attached here)."""
        ...

    @op.post("/sandboxes/{sandbox_id}/touch")
    async def touch(self, sandbox_id: str) -> SandboxInfo:
        """Record activity without doing anything else (the idle clock restarts)."""
        ...

    # -- commands, files, terminals ------------------------------------------------------------------------
    @op.post("/sandboxes/{sandbox_id}/exec", timeout=EXEC)
    async def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult: ...

    @op.post("/sandboxes/{sandbox_id}/exec/stream", timeout=EXEC)
    def exec_stream(self, sandbox_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Output as it comes, then one ``exit`` event. Errors before the first event raise; later ones too."""
        ...

    @op.get("/sandboxes/{sandbox_id}/files", query={"path": GUEST_PATH})
    async def read_file(self, sandbox_id: str, path: str) -> bytes: ...

    @op.put("/sandboxes/{sandbox_id}/files", query={"path": GUEST_PATH, "user": GUEST_USER}, max_body=MAX_FILE_BYTES)
    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> WriteResult:
        """Write ``data`` (parents created); with ``user``, what it creates is owned by that guest user."""
        ...

    @op.post("/sandboxes/{sandbox_id}/files/op", check=_known_file_op)
    async def file_op(self, sandbox_id: str, op: str, path: str) -> FsReply:
        """``delete``, ``list_dir``, ``stat`` or ``mkdir`` (:data:`FILE_OPS`); returns the guest's answer."""
        ...

    @op.get("/sandboxes/{sandbox_id}/net")
    async def inspect_net(self, sandbox_id: str) -> NetInspection: ...

    @op.post("/sandboxes/{sandbox_id}/pty", timeout=NONE)
    def pty_open(self, sandbox_id: str, request: PtyOpen) -> AsyncIterator[PtyEvent]:
        """A terminal: first a ``session`` event, then ``output``, then ``exit`` when the program ends.
        The sandbox counts as busy (never reaped) while the stream is open."""
        ...

    @op.post("/sandboxes/{sandbox_id}/pty/{session}/input", max_body=MAX_PTY_INPUT_BYTES)
    async def pty_input(self, sandbox_id: str, session: str, data: bytes) -> None: ...

    @op.post("/sandboxes/{sandbox_id}/pty/{session}/resize")
    async def pty_resize(self, sandbox_id: str, session: str, cols: int, rows: int) -> None: ...

    @op.post("/sandboxes/{sandbox_id}/pty/{session}/close")
    async def pty_close(self, sandbox_id: str, session: str) -> None: ...

    # -- long-lived processes, watches, richer file ops, ports ---------------------------------------------
    @op.post("/sandboxes/{sandbox_id}/procs/start", timeout=NONE)
    def proc_start(self, sandbox_id: str, request: ProcStart) -> AsyncIterator[ProcEvent]:
        """Start a process: a ``start`` event (its pid), its output, then ``end``. Closing the stream early only
        detaches; the process keeps running (reattach with :meth:`proc_connect`)."""
        ...

    @op.post("/sandboxes/{sandbox_id}/procs/connect", timeout=NONE)
    def proc_connect(self, sandbox_id: str, process: ProcSelector) -> AsyncIterator[ProcEvent]:
        """Reattach: ``start``, the buffered output so far, live output, then ``end`` (at once for a process
        that already ended and is still remembered). ``NotFound`` for a process the guest does not know."""
        ...

    @op.get("/sandboxes/{sandbox_id}/procs")
    async def proc_list(self, sandbox_id: str) -> list[ProcInfo]: ...

    @op.post("/sandboxes/{sandbox_id}/procs/input")
    async def proc_input(self, sandbox_id: str, request: ProcInput) -> None: ...

    @op.post("/sandboxes/{sandbox_id}/procs/signal")
    async def proc_signal(self, sandbox_id: str, request: ProcSignal) -> None: ...

    @op.post("/sandboxes/{sandbox_id}/procs/resize")
    async def proc_resize(self, sandbox_id: str, request: ProcResize) -> None: ...

    @op.post("/sandboxes/{sandbox_id}/fs")
    async def fs(self, sandbox_id: str, request: FsRequest) -> FsReply:
        """A file-system call (:class:`~.models_procs.FsRequest`); returns the guest's answer."""
        ...

    @op.post("/sandboxes/{sandbox_id}/fs/watch", timeout=NONE)
    def fs_watch(self, sandbox_id: str, request: WatchRequest) -> AsyncIterator[FsEvent]:
        """Changes under a directory: ``start`` once the watch is in place, then one event per change, until the
        caller closes the stream."""
        ...

    @op.custom("HttpAgent names the agent's port route (http_ports.py), which proxies to this target")
    async def port_target(self, sandbox_id: str, port: int) -> PortTarget:
        """Where to send HTTP/WebSocket traffic for a guest port (``InvalidArgument`` outside 1–65535)."""
        ...

    # -- snapshots and forks -------------------------------------------------------------------------------
    @op.post("/sandboxes/{sandbox_id}/snapshots", timeout=LONG)
    async def snapshot(self, sandbox_id: str, request: SnapshotRequest) -> SnapshotInfo:
        """Capture a running or paused sandbox (it keeps running); the snapshot is durable on this host."""
        ...

    @op.post("/snapshots/{snapshot_id}/store", timeout=LONG)
    async def store_snapshot(self, snapshot_id: str) -> StoredSnapshot:
        """Upload a local snapshot to the object store (idempotent), so any agent can restore it."""
        ...

    @op.delete("/snapshots/{snapshot_id}", query={"from_store": op.Query()}, timeout=LONG)
    async def delete_snapshot(self, snapshot_id: str, *, from_store: bool = False) -> None:
        """Remove this host's copy (and, with ``from_store``, the stored objects); idempotent."""
        ...

    @op.post("/snapshots/prune", timeout=LONG, reply_key="removed")
    async def prune_snapshots(self, keep: list[str]) -> list[str]:
        """Remove local snapshot copies whose id is not in ``keep`` (registry rows); returns what went."""
        ...

    @op.post("/sandboxes/{sandbox_id}/fork", timeout=LONG)
    async def fork(self, sandbox_id: str, request: ForkRequest) -> SandboxInfo:
        """A child cold-booted on this host from a copy of the parent's disk."""
        ...

    @op.post("/sandboxes/{sandbox_id}/fork-tree", timeout=LONG)
    async def fork_tree(self, sandbox_id: str, request: TreeRequest) -> TreeResult: ...

    @op.get("/snapshots/{snapshot_id}/evidence")
    async def evidence_list(self, snapshot_id: str) -> list[EvidenceEntry]: ...

    @op.get("/snapshots/{snapshot_id}/evidence/{name:path}")
    async def evidence_read(self, snapshot_id: str, name: str) -> bytes: ...

    @op.put("/snapshots/{snapshot_id}/evidence/{name:path}", max_body=MAX_FILE_BYTES, reply_key="bytes")
    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int: ...

    # -- templates -----------------------------------------------------------------------------------------
    @op.post("/templates", timeout=NONE)
    def build_template(self, build: TemplateBuild) -> AsyncIterator[BuildEvent]:
        """Build and bake a custom template here; progress lines, then one event with ``template`` or
        ``error``. The agent serves creates from it afterwards."""
        ...

    @op.delete("/templates/{name}")
    async def remove_template(self, name: str) -> None: ...

    async def close(self) -> None:
        """Release the transport (the HTTP client's connections); never stops the agent itself."""
        ...


OPERATIONS: Mapping[str, op.Op] = op.operations_of(Agent)
"""Every operation of :class:`Agent` (all its methods but ``close``), by method name, in declaration order."""

__all__ = ["FILE_OPS", "MAX_FILE_BYTES", "MAX_PTY_INPUT_BYTES", "OPERATIONS", "Agent"]
