"""The host-agent interface's wire models: plain request/response values, no shared Python objects.

Every call the control plane makes to a host agent takes and returns these (pydantic models, JSON on the HTTP
transport, deep copies on the in-process one), so the two transports behave the same and the control plane can
never reach into an agent's objects. Times are epoch seconds on the agent's clock; sizes are MiB or bytes as
named.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from ..netpolicy import EgressPolicy, legacy_policy
from ..proxy.target import PortTarget as PortTarget
from . import models_guest as _guest
from . import models_procs as _procs
from . import models_templates as _templates
from .models_volumes import ChildVolume, VolumeMount

SandboxState = Literal["starting", "running", "paused", "hibernated", "stopped", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


Policy = Annotated[EgressPolicy | None, BeforeValidator(legacy_policy)]
"""A sandbox's network policy; ``None``: nothing allowed (a value of before policies, a list of CIDRs the guest
may reach, reads as a policy allowing exactly those)."""

SHA256_HEX = r"^[0-9a-f]{64}$"
ManifestSha256 = Annotated[str, Field(pattern=SHA256_HEX)]
"""The sha256 (hex) of the exact manifest bytes a publish uploaded: the registry pins it, an import checks it."""


class SnapshotRef(_Model):
    """What an agent needs to restore a snapshot it may not hold: it uses its local copy when it has one,
    otherwise it imports the snapshot from the object store (``stored``) and pages its memory from there."""

    id: str
    template: str
    stored: bool = False
    manifest_sha256: ManifestSha256 | None = None
    """What the stored manifest must hash to (the registry row's pin), checked before an import parses it;
    ``None`` (a snapshot stored before manifests were pinned): the manifest is trusted as fetched, with a warning."""


class CreateSpec(_Model):
    """Restore a new sandbox. The control plane chooses the id (so a reservation, a row and a retried call
    all name the same sandbox)."""

    sandbox_id: str
    template: str
    workspace_id: str
    from_snapshot: SnapshotRef | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    ttl_s: int | None = None
    persistent: bool = False
    egress: Policy = None
    volumes: list[VolumeMount] = Field(default_factory=list)
    """Volumes to attach (their images on this agent), mounted before the create answers."""


class SandboxInfo(_Model):
    """What an agent says of one of its sandboxes."""

    id: str
    template: str
    cpus: int
    memory_mib: int
    state: SandboxState
    workspace_id: str
    created_at: float
    metadata: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    boot_mode: Literal["restore", "cold"] = "restore"
    boot_ms: float = 0.0
    from_snapshot: str | None = None
    instance_id: str | None = None
    guest_ip: str | None = None
    vm_id: str | None = None
    ttl_s: int | None = None
    persistent: bool = False
    last_active: float = 0.0
    in_flight: int = 0
    """Requests (exec, streams, terminals) running in the sandbox now; a busy sandbox never expires."""
    expires_at: float | None = None
    """Idle-based TTL: ``last_active + ttl_s`` (``None`` when persistent or without TTL)."""
    idle_s: float = 0.0
    expired: bool = False
    """Idle past its TTL with nothing in flight: the control plane's reaper deletes it."""
    egress: Policy = None
    """The network policy in force (``None``: nothing allowed)."""
    adopted: bool = False
    """The agent took this sandbox over from its previous process at start (its VM outlived a restart)."""


class LifecyclePatch(_Model):
    """Change a sandbox's TTL and/or persistence; ``set_ttl`` distinguishes "no change" from "no TTL"."""

    set_ttl: bool = False
    ttl_s: int | None = None
    persistent: bool | None = None


class ExecRequest(_Model):
    cmd: str
    timeout_s: float | None = 60.0
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    stdin_b64: str | None = None
    user: str | None = Field(default=None, max_length=64)
    """Run as this account; ``None``: the image's default user (``/etc/cryobox/defaults.json``), else
    ``default_user``, else root."""
    default_user: str | None = Field(default=None, max_length=64)
    """The front door's default account, used only when neither ``user`` nor the image names one."""


class ExecResult(_Model):
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool = False


class ExecEvent(_Model):
    """One item of a streamed exec: ``stdout``/``stderr`` with ``text``, or ``exit`` with ``result``."""

    kind: Literal["stdout", "stderr", "exit"]
    text: str = ""
    result: ExecResult | None = None


class WriteResult(_Model):
    path: str
    bytes: int


class PtyOpen(_Model):
    cols: int = 80
    rows: int = 24
    cmd: str | None = None


class PtyEvent(_Model):
    """``session`` (the session id in ``text``), ``output`` (base64 in ``data``) or ``exit`` (``exit_code``)."""

    kind: Literal["session", "output", "exit"]
    text: str = ""
    data_b64: str = ""
    exit_code: int | None = None


class SnapshotRequest(_Model):
    snapshot_id: str
    labels: dict[str, str] = Field(default_factory=dict)
    quiesce: bool = False


class SnapshotInfo(_Model):
    """A finished, durable snapshot on the agent's disk."""

    id: str
    template: str
    generation: str | None = None
    """The template generation the snapshot's disk and memory sit on (restorable where that one is served)."""
    sandbox_id: str | None = None
    parent_id: str | None = None
    size_bytes: int = 0
    """The allocated size of all its files."""
    unique_bytes: int = 0
    """Bytes only this snapshot holds: the memory pages it changed from its parent image, its device state and its
    disk overlay (not sent by an agent that predates layering: the control plane then records ``size_bytes``)."""
    shared_bytes: int = 0
    """Memory bytes it shares with its parent image (a template generation or another snapshot)."""
    pause_ms: float | None = None
    created_at: float = 0.0
    labels: dict[str, str] = Field(default_factory=dict)
    path: str = ""


class StoredSnapshot(_Model):
    id: str
    store: str
    key: str
    manifest_sha256: ManifestSha256 | None = None
    """The sha256 of the manifest bytes the agent uploaded (``None`` from an agent that predates pinning)."""


class StoredHibernation(_Model):
    """A hibernated sandbox's image in the object store (``hibernations/<sandbox id>/``): any agent serving
    ``generation`` of its template can wake it (:class:`WakeSpec`)."""

    id: str
    store: str
    key: str
    generation: str
    """The template generation the image's disk and memory sit on."""
    size_bytes: int = 0
    unique_bytes: int = 0
    """Bytes only this image holds (as :attr:`SnapshotInfo.unique_bytes`)."""
    shared_bytes: int = 0
    """Memory bytes it shares with its template generation (as :attr:`SnapshotInfo.shared_bytes`)."""
    manifest_sha256: ManifestSha256 | None = None
    """The sha256 of the manifest bytes the agent uploaded (``None`` from an agent that predates pinning)."""


class WakeSpec(_Model):
    """Wake, on this agent, a sandbox hibernated on another one whose image is in the object store: the same
    sandbox (id, identity, settings, files and processes), imported from ``hibernations/<sandbox_id>/``."""

    sandbox_id: str
    template: str
    workspace_id: str
    created_at: float
    instance_id: str
    metadata: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    ttl_s: int | None = None
    persistent: bool = False
    egress: Policy = None
    from_snapshot: str | None = None
    boot_mode: Literal["restore", "cold"] = "restore"
    manifest_sha256: ManifestSha256 | None = None
    """What the stored image's manifest must hash to (the row's pin), checked before the import parses it;
    ``None`` (stored before manifests were pinned): trusted as fetched, with a warning."""


class ForkRequest(_Model):
    child_id: str
    metadata: dict[str, str] = Field(default_factory=dict)
    volumes: list[ChildVolume] = Field(default_factory=list)
    """The child's volumes (clones of the parent's read-write ones, taken in the parent's pause, and its
    read-only ones), mounted once it has booted."""


class TreeRequest(_Model):
    """One snapshot of the parent, then one restore of it per ``child_ids`` entry, in parallel, on this agent.
    With no children it is only the snapshot (the control plane places the children elsewhere)."""

    snapshot_id: str
    child_ids: list[str] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    tree_id: str
    volumes: dict[str, list[ChildVolume]] = Field(default_factory=dict)
    """Per child id, its volumes: clones (made while the parent's guest has its volumes released for the
    capture) and the read-only ones it shares."""


class TreeChildError(_Model):
    child_id: str
    error: str


class TreeResult(_Model):
    snapshot: SnapshotInfo
    children: list[SandboxInfo] = Field(default_factory=list)
    errors: list[TreeChildError] = Field(default_factory=list)


class EvidenceEntry(_Model):
    name: str
    size: int
    source: str = ""


class Capacity(_Model):
    """An agent's capacity as it reports it in every heartbeat."""

    vcpus_total: int
    memory_total_mib: int
    max_sandboxes: int
    vcpus_committed: int = 0
    memory_committed_mib: int = 0
    sandboxes: int = 0
    sandboxes_running: int = 0
    restores_in_flight: int = 0
    restores_peak: int = 0
    """The most restores that ran at once on this agent since it started (admission's bound, observed)."""
    max_concurrent_restores: int = 0
    admission_queue_depth: int = 0
    prespawned: int = 0
    """Warm QEMUs waiting in the template pools."""
    memory_pooled_mib: int = 0
    """Memory held ready: the guest memory of the pools' QEMUs (ready or being prepared) and the snapshot staging
    reserve (``CRYOBOX_STAGING_RESERVE_MIB``); placement counts it as used."""
    templates_ready: dict[str, str] = Field(default_factory=dict)
    """Template name -> the generation this agent serves."""
    hot_images: list[str] = Field(default_factory=list)
    """Templates (by generation) and snapshots (by id) whose memory this host holds locally."""
    local_snapshots: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def memory_free_mib(self) -> int:
        return max(0, self.memory_total_mib - self.memory_committed_mib - self.memory_pooled_mib)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def vcpus_free(self) -> int:
        return max(0, self.vcpus_total - self.vcpus_committed)


class AgentInfo(_Model):
    name: str
    version: str
    accelerator: str
    boot_id: str
    """New every time the agent process starts: a changed one tells the control plane to reconcile."""
    url: str = ""
    """Where the control plane reaches the agent (empty for the in-process agent)."""
    isolation: str = ""
    jail: dict[str, Any] = Field(default_factory=dict)
    """How the agent confines QEMU (``enabled``, uid range, cgroup version, what the host weakened for it)."""


class Heartbeat(_Model):
    """What an agent sends the control plane every few seconds (and at start: registration)."""

    agent: AgentInfo
    capacity: Capacity
    sandboxes: list[SandboxInfo] = Field(default_factory=list)
    """Everything the agent runs now: authoritative for rows of its host."""


class HeartbeatReply(_Model):
    accepted: bool = True
    reconciled: bool = False


# the models of long-lived processes, watches and file ops (models_procs.py), in this one namespace
# (and PortTarget, above: the port proxy's own value, proxy/target.py)
FsEvent = _procs.FsEvent
FsRequest = _procs.FsRequest
ProcEvent = _procs.ProcEvent
ProcInfo = _procs.ProcInfo
ProcInput = _procs.ProcInput
ProcResize = _procs.ProcResize
ProcSelector = _procs.ProcSelector
ProcSignal = _procs.ProcSignal
ProcStart = _procs.ProcStart
PtySize = _procs.PtySize
WatchRequest = _procs.WatchRequest

# the guest's answers (models_guest.py) and the template models (models_templates.py), in this one namespace
FsChange = _guest.FsChange
FsEntry = _guest.FsEntry
FsReply = _guest.FsReply
NetInspection = _guest.NetInspection
BuildEvent = _templates.BuildEvent
BuildSpec = _templates.BuildSpec
TemplateBuild = _templates.TemplateBuild
TemplateInfo = _templates.TemplateInfo


class EgressDecision(_Model):
    """One decision of a sandbox's egress proxy or name server."""

    time: float
    """When the connection (or query) arrived, epoch seconds."""
    name: str | None = None
    """The name it carried (TLS SNI, HTTP ``Host``, the DNS query), if any."""
    ip: str | None = None
    """The address judged (and, when allowed, connected to); none for a DNS query."""
    port: int
    allowed: bool
    reason: str
    """``floor``, ``port``, ``deny-name``, ``deny-cidr``, ``allow-name``, ``allow-cidr``, ``default``,
    ``unresolved``, ``limit`` (too many open connections) or ``dns`` (a query for a name that may not resolve)."""
    bytes_out: int = 0
    bytes_in: int = 0
    error: str | None = None
    """``unreachable`` (allowed, but the destination did not answer) or ``cut`` (ended by a policy change)."""


class EgressLog(_Model):
    """A sandbox's newest decisions, oldest first; ``dropped`` older ones no longer kept."""

    items: list[EgressDecision]
    dropped: int = 0


class NetworkUpdate(_Model):
    """A sandbox's whole new network policy (anything omitted is cleared)."""

    policy: EgressPolicy
