"""The typed interface between the control plane and a host agent.

The control plane decides *where* and *whether* (auth, quotas, placement, the registry); an agent decides *how*
on its host (admission, warm pools, network slots, QEMU, snapshots, idle tracking). Every call crosses this
protocol with the plain values of :mod:`.models`; errors cross as the :mod:`cryobox.errors` tree (on HTTP as
``{"error", "code", "details"}`` with the code's status, rebuilt into the same class on the other side).

Two transports implement it: :class:`~.inprocess.InProcessAgent` (``cryobox serve``: one process) and
:class:`~.http_client.HttpAgent` (``cryobox agent`` behind :func:`~.http_server.create_agent_app`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from ..proxy.target import PortTarget
from .models import (
    AgentInfo,
    BuildEvent,
    Capacity,
    CreateSpec,
    EvidenceEntry,
    ExecEvent,
    ExecRequest,
    ExecResult,
    ForkRequest,
    FsReply,
    LifecyclePatch,
    NetInspection,
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

FILE_OPS = frozenset({"delete", "list_dir", "stat", "mkdir"})
MAX_FILE_BYTES = 64 << 20
"""The largest file (or evidence) body an agent accepts, on either transport; the guest enforces the same limit."""


@runtime_checkable
class Agent(Protocol):
    """One host agent. Every method may raise a :class:`~cryobox.errors.CryoboxError`; sandbox-scoped ones
    raise ``NotFound`` for an id the agent does not hold. A hibernated sandbox is woken by any request that
    needs its guest (exec, files, terminals, snapshot, fork)."""

    # -- the host ------------------------------------------------------------------------------------------
    async def info(self) -> AgentInfo: ...

    async def capacity(self) -> Capacity: ...

    async def templates(self) -> list[TemplateInfo]: ...

    async def metrics_text(self) -> bytes:
        """The agent's own Prometheus series (memory server, admission), text exposition format."""
        ...

    # -- sandboxes -----------------------------------------------------------------------------------------
    async def list_sandboxes(self) -> list[SandboxInfo]: ...

    async def create(self, spec: CreateSpec) -> SandboxInfo:
        """Restore a sandbox (admission-controlled: ``HostUnavailable`` when the agent's queue is full)."""
        ...

    async def get(self, sandbox_id: str) -> SandboxInfo: ...

    async def delete(self, sandbox_id: str) -> None:
        """Kill the sandbox and free its slot; idempotent (an unknown id is not an error)."""
        ...

    async def pause(self, sandbox_id: str) -> SandboxInfo: ...

    async def resume(self, sandbox_id: str) -> SandboxInfo: ...

    async def hibernate(self, sandbox_id: str) -> SandboxInfo: ...

    async def wake(self, sandbox_id: str) -> SandboxInfo: ...

    async def store_hibernation(self, sandbox_id: str) -> StoredHibernation:
        """Copy a hibernated sandbox's image to the object store (idempotent; ``StateError`` unless hibernated),
        so another agent can wake it (:meth:`wake_stored`)."""
        ...

    async def wake_stored(self, spec: WakeSpec) -> SandboxInfo:
        """Import a stored hibernation (its overlay rebased onto this host's copy of the template's disk) and wake
        it here as the same sandbox; admission-controlled like a create. A retried call wakes the one it made."""
        ...

    async def set_lifecycle(self, sandbox_id: str, patch: LifecyclePatch) -> SandboxInfo:
        """Change TTL/persistence; counts as activity (the idle clock restarts)."""
        ...

    async def touch(self, sandbox_id: str) -> SandboxInfo:
        """Record activity without doing anything else (the idle clock restarts)."""
        ...

    # -- commands, files, terminals ------------------------------------------------------------------------
    async def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult: ...

    def exec_stream(self, sandbox_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Output as it comes, then one ``exit`` event. Errors before the first event raise; later ones too."""
        ...

    async def read_file(self, sandbox_id: str, path: str) -> bytes: ...

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, user: str | None = None) -> WriteResult:
        """Write ``data`` (parents created); with ``user``, what it creates is owned by that guest user."""
        ...

    async def file_op(self, sandbox_id: str, op: str, path: str) -> FsReply:
        """``delete``, ``list_dir``, ``stat`` or ``mkdir`` (:data:`FILE_OPS`); returns the guest's answer."""
        ...

    async def inspect_net(self, sandbox_id: str) -> NetInspection: ...

    def pty_open(self, sandbox_id: str, request: PtyOpen) -> AsyncIterator[PtyEvent]:
        """A terminal: first a ``session`` event, then ``output``, then ``exit`` when the program ends.
        The sandbox counts as busy (never reaped) while the stream is open."""
        ...

    async def pty_input(self, sandbox_id: str, session: str, data: bytes) -> None: ...

    async def pty_resize(self, sandbox_id: str, session: str, cols: int, rows: int) -> None: ...

    async def pty_close(self, sandbox_id: str, session: str) -> None: ...

    # -- long-lived processes, watches, richer file ops, ports ---------------------------------------------
    def proc_start(self, sandbox_id: str, request: ProcStart) -> AsyncIterator[ProcEvent]:
        """Start a process: a ``start`` event (its pid), its output, then ``end``. Closing the stream early only
        detaches; the process keeps running (reattach with :meth:`proc_connect`)."""
        ...

    def proc_connect(self, sandbox_id: str, process: ProcSelector) -> AsyncIterator[ProcEvent]:
        """Reattach: ``start``, the buffered output so far, live output, then ``end`` (at once for a process
        that already ended and is still remembered). ``NotFound`` for a process the guest does not know."""
        ...

    async def proc_list(self, sandbox_id: str) -> list[ProcInfo]: ...

    async def proc_input(self, sandbox_id: str, request: ProcInput) -> None: ...

    async def proc_signal(self, sandbox_id: str, request: ProcSignal) -> None: ...

    async def proc_resize(self, sandbox_id: str, request: ProcResize) -> None: ...

    async def fs(self, sandbox_id: str, request: FsRequest) -> FsReply:
        """A file-system call (:class:`~.models_procs.FsRequest`); returns the guest's answer."""
        ...

    def fs_watch(self, sandbox_id: str, request: WatchRequest) -> AsyncIterator[FsEvent]:
        """Changes under a directory: ``start`` once the watch is in place, then one event per change, until the
        caller closes the stream."""
        ...

    async def port_target(self, sandbox_id: str, port: int) -> PortTarget:
        """Where to send HTTP/WebSocket traffic for a guest port (``InvalidArgument`` outside 1–65535)."""
        ...

    # -- snapshots and forks -------------------------------------------------------------------------------
    async def snapshot(self, sandbox_id: str, request: SnapshotRequest) -> SnapshotInfo:
        """Capture a running or paused sandbox (it keeps running); the snapshot is durable on this host."""
        ...

    async def store_snapshot(self, snapshot_id: str) -> StoredSnapshot:
        """Upload a local snapshot to the object store (idempotent), so any agent can restore it."""
        ...

    async def delete_snapshot(self, snapshot_id: str, *, from_store: bool = False) -> None:
        """Remove this host's copy (and, with ``from_store``, the stored objects); idempotent."""
        ...

    async def prune_snapshots(self, keep: list[str]) -> list[str]:
        """Remove local snapshot copies whose id is not in ``keep`` (registry rows); returns what went."""
        ...

    async def fork(self, sandbox_id: str, request: ForkRequest) -> SandboxInfo:
        """A child cold-booted on this host from a copy of the parent's disk."""
        ...

    async def fork_tree(self, sandbox_id: str, request: TreeRequest) -> TreeResult: ...

    async def evidence_list(self, snapshot_id: str) -> list[EvidenceEntry]: ...

    async def evidence_read(self, snapshot_id: str, name: str) -> bytes: ...

    async def evidence_put(self, snapshot_id: str, name: str, data: bytes) -> int: ...

    # -- templates -----------------------------------------------------------------------------------------
    def build_template(self, build: TemplateBuild) -> AsyncIterator[BuildEvent]:
        """Build and bake a custom template here; progress lines, then one event with ``template`` or
        ``error``. The agent serves creates from it afterwards."""
        ...

    async def remove_template(self, name: str) -> None: ...

    async def close(self) -> None:
        """Release the transport (the HTTP client's connections); never stops the agent itself."""
        ...
