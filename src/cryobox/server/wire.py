"""Server-side wire models for snapshots, forks and lifecycle actions (``/v1``; see docs/API.md).

The SDK parses the same JSON into the frozen dataclasses of :mod:`cryobox.models`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ..models import Metadata, Sandbox, SandboxStatus

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
LabelValue = Annotated[str, StringConstraints(max_length=1024)]
Labels = dict[LabelKey, LabelValue]


class SnapshotCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: Labels = Field(default_factory=dict, max_length=64)
    retain: bool = False
    quiesce: bool = False


class SnapshotImportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    labels: Labels = Field(default_factory=dict, max_length=64)
    retain: bool = True


class SnapshotPublished(BaseModel):
    id: str
    store: str
    key: str


class SnapshotPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: Labels | None = Field(default=None, max_length=64)
    retain: bool | None = None


class Snapshot(BaseModel):
    id: str
    sandbox_id: str | None
    template: str
    size_bytes: int
    """The allocated size of all its files (what the snapshot-bytes quota counts)."""
    unique_bytes: int = 0
    """Bytes only this snapshot holds: the memory pages it changed from its parent image, its device state and its
    disk overlay (deleting it frees about this much)."""
    shared_bytes: int = 0
    """Memory bytes it shares with its parent image (a template generation or another snapshot)."""
    created_at: str
    labels: dict[str, str] = Field(default_factory=dict)
    retain: bool = False
    parent_id: str | None = None
    pause_ms: float | None = None
    location: str = "local"
    """``local`` (on the agent that took it) or ``stored`` (in the object store: restorable on any agent)."""
    host: str | None = None


class SnapshotList(BaseModel):
    snapshots: list[Snapshot]


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: Metadata = Field(default_factory=dict)


class ForkResponse(BaseModel):
    parent_id: str
    sandbox: Sandbox


class ForkTreeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int = Field(default=2, ge=1, le=16)
    metadata: Metadata = Field(default_factory=dict)


class ForkTreeError(BaseModel):
    index: int
    error: str


class ForkTreeResponse(BaseModel):
    tree_id: str
    parent_id: str
    snapshot_id: str
    children: list[Sandbox]
    errors: list[ForkTreeError]


class PromoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tree_id: str = Field(min_length=1)
    cleanup_siblings: bool = True


class PromoteFailure(BaseModel):
    id: str
    error: str


class PromoteResponse(BaseModel):
    winner: str
    tree_id: str
    deleted: list[str]
    failures: list[PromoteFailure]


class StatusResponse(BaseModel):
    status: SandboxStatus


class EvidenceFile(BaseModel):
    name: str
    size: int


class EvidenceList(BaseModel):
    files: list[EvidenceFile]


class DrainedSandbox(BaseModel):
    id: str
    seconds: float
    """Hibernating it and copying its image to the object store (0 when that was done already)."""
    already: bool = False


class DrainSkipped(BaseModel):
    id: str
    status: str


class DrainError(BaseModel):
    id: str
    code: str
    error: str


class DrainResponse(BaseModel):
    agent: str
    status: str
    count: int
    """Sandboxes of the agent that are now portable (hibernated, their image in the object store)."""
    drained: list[DrainedSandbox]
    skipped: list[DrainSkipped]
    errors: list[DrainError]
    seconds: float


class AgentStatus(BaseModel):
    name: str
    status: str


class QuotaLimits(BaseModel):
    sandboxes: int
    vcpus: int
    memory_mib: int
    snapshot_bytes: int
    templates: int
    default_ttl_s: int | None
    """Given to creates without ``ttl_seconds`` (``null``: they never expire)."""
    max_ttl_s: int
    hibernated: int
    """Hibernated (paused) sandboxes the workspace may keep."""
    paused_retention_s: float
    """How long a sandbox stays hibernated before it is deleted (the server's ``--paused-retention``)."""
    volumes: int
    volume_bytes: int


class QuotaUsage(BaseModel):
    sandboxes: int
    """Sandboxes starting, running or paused (plus creates and wakes in flight)."""
    vcpus: int
    """Of those."""
    memory_mib: int
    snapshot_bytes: int
    templates: int
    """Custom templates, any status."""
    hibernated: int
    """Hibernated sandboxes (plus hibernations in flight)."""
    volumes: int
    volume_bytes: int
    """The sizes of its volumes, summed."""


class QuotaResponse(BaseModel):
    workspace: str
    workspace_id: str
    limits: QuotaLimits
    usage: QuotaUsage
