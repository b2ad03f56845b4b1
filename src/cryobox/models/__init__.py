"""Wire models of the public API (``/v1``), shared by the server and the SDK."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from ..errors import InvalidArgument
from ..netpolicy import EgressPolicy, parse_cidrs
from . import network as _network
from . import observe as _observe
from . import procs as _procs
from . import volumes as _volumes
from .builds import *  # noqa: F403 (template builds, builds.py, in this one namespace)
from .builds import FailedStep
from .code import *  # noqa: F403 (the code interpreter's models, models_code.py, in this one namespace)
from .network import PolicyView

MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
MetaValue = Annotated[str, StringConstraints(max_length=1024)]
Metadata = Annotated[dict[MetaKey, MetaValue], Field(max_length=64)]
"""Request metadata: at most 64 entries, keys 1-128 and values up to 1024 characters (what a list filter needs)."""
EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^=\x00]+$")]
EnvValue = Annotated[str, StringConstraints(max_length=32768, pattern=r"^[^\x00]*$")]
Env = Annotated[dict[EnvKey, EnvValue], Field(max_length=256)]
"""Environment variables: at most 256, names without ``=`` or NUL, values up to 32 KiB without NUL."""

# the models of background processes (models_procs.py), in this one namespace
Process = _procs.Process
ProcessInput = _procs.ProcessInput
ProcessList = _procs.ProcessList
ProcessPty = _procs.ProcessPty
ProcessResult = _procs.ProcessResult
ProcessSignal = _procs.ProcessSignal

# a sandbox's network policy and egress decision log (network.py), in this one namespace
NetworkPolicy = _network.NetworkPolicy
EgressDecision = _network.EgressDecision
EgressLog = _network.EgressLog

# a sandbox's samples and log (observe.py), in this one namespace
MetricSample = _observe.MetricSample
SandboxMetrics = _observe.SandboxMetrics
SandboxLogEntry = _observe.SandboxLogEntry
SandboxLogs = _observe.SandboxLogs

# volumes (volumes.py), in this one namespace
CreateVolumeRequest = _volumes.CreateVolumeRequest
ResizeVolumeRequest = _volumes.ResizeVolumeRequest
SandboxVolume = _volumes.SandboxVolume
Volume = _volumes.Volume
VolumeEntry = _volumes.VolumeEntry
VolumeEntryList = _volumes.VolumeEntryList
VolumeList = _volumes.VolumeList
VolumeRestored = _volumes.VolumeRestored
VolumeMount = _volumes.VolumeMount
VolumeMountRequest = _volumes.VolumeMountRequest

SandboxStatus = Literal["starting", "running", "paused", "hibernated", "stopped", "error", "lost"]
BootMode = Literal["restore", "cold"]


class NetworkSpec(BaseModel):
    """The network shape of before policies: ``{"egress": "deny"|"allow", "allow": [cidr…]}``, still accepted by
    create (:func:`network_policy` translates it)."""

    model_config = ConfigDict(extra="forbid")
    egress: Literal["deny", "allow"] = "deny"
    allow: list[str] = Field(default_factory=list)


_POLICY_ONLY = frozenset(EgressPolicy.model_fields) - {"allow"}


def network_policy(value: Any) -> Any:
    """Create's ``network`` as a policy mapping: the policy shape passes; the shape of before policies (it has
    ``egress``) is translated: ``allow`` with no list allows ``0.0.0.0/0``, with a list exactly that list, ``deny``
    allows nothing; the default is deny either way. A mapping mixing both shapes is refused (``ValueError``)."""
    if not isinstance(value, Mapping) or "egress" not in value:
        return value
    mixed = sorted(_POLICY_ONLY & set(value))
    if mixed:
        raise ValueError(f"mixes the legacy shape (egress) with the policy shape ({', '.join(mixed)}): use one")
    legacy = NetworkSpec.model_validate(value)
    try:
        parse_cidrs(legacy.allow)  # the legacy shape's rules are networks only
    except InvalidArgument as err:
        raise ValueError(err.message) from err
    if legacy.egress == "deny":
        return {"default": "deny"}
    return {"default": "deny", "allow": list(legacy.allow) or ["0.0.0.0/0"]}


OnTimeoutAction = Literal["kill", "hibernate"]
"""What a sandbox's TTL expiry does."""


class CreateSandboxRequest(BaseModel):
    """A field cryobox does not carry out (a typo) is a 400 naming it, never parsed and dropped."""

    model_config = ConfigDict(extra="forbid")
    template: str = Field(default="code-interpreter", min_length=1, max_length=128)
    ttl_seconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)
    persistent: bool = False
    metadata: Metadata = Field(default_factory=dict)
    from_snapshot: str | None = None
    env: Env = Field(default_factory=dict)
    network: Annotated[NetworkPolicy | None, BeforeValidator(network_policy)] = None
    """The policy (``null`` or absent: nothing allowed, or, from a snapshot, the snapshot's recorded policy); the
    legacy ``{"egress", "allow"}`` shape is accepted too."""
    on_timeout: OnTimeoutAction = "kill"
    """What the TTL's expiry does: ``kill`` deletes the sandbox; ``hibernate`` keeps it hibernated (memory and
    disk, no RAM held) until it is resumed, or deleted after the server's paused retention."""
    auto_wake: bool = True
    """Whether any request for it (exec, files, ports, envd) wakes it when hibernated; ``false``: only an explicit
    ``resume``/``wake`` does (other requests get 409)."""
    volumes: list[_volumes.VolumeMountRequest] | None = Field(default=None, max_length=4)
    """Volumes to mount (``null``: none, or from a snapshot the snapshot's mounts)."""


class Sandbox(BaseModel):
    id: str
    template: str
    cpu: int
    memory_mb: int
    status: SandboxStatus
    guest_ip: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    from_snapshot: str | None = None
    boot_ms: float
    boot_mode: BootMode
    created_at: str
    persistent: bool = False
    expires_at: str | None = None
    host: str | None = None
    instance_id: str | None = None
    network: PolicyView | None = None
    """The network policy in force (this server always says; ``None`` only from one that predates policies)."""
    on_timeout: OnTimeoutAction = "kill"
    auto_wake: bool = True
    hibernated_at: str | None = None
    """When it was hibernated (``null`` unless it is)."""
    volumes: list[_volumes.SandboxVolume] | None = None
    """Its mounted volumes: in ``GET /v1/sandboxes/{id}`` and a create's answer (``null`` in lists and other
    answers, which do not read them)."""


class SandboxList(BaseModel):
    items: list[Sandbox]


class Lifecycle(BaseModel):
    ttl_seconds: int | None
    persistent: bool
    idle_seconds: float
    expires_at: str | None
    """When its TTL runs out if it stays idle (``null``: never; a hibernated sandbox's TTL does not run)."""
    on_timeout: OnTimeoutAction = "kill"
    auto_wake: bool = True
    hibernated_at: str | None = None
    retained_until: str | None = None
    """A hibernated sandbox is deleted then (the server's paused retention), unless resumed before."""


class LifecyclePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_seconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)
    persistent: bool | None = None
    on_timeout: OnTimeoutAction | None = None
    auto_wake: bool | None = None


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: str = Field(min_length=1, max_length=1 << 20)
    timeout_seconds: float | None = Field(default=60.0, gt=0, le=24 * 3600)
    env: Env = Field(default_factory=dict)
    cwd: str | None = None
    stdin: str | None = Field(default=None, max_length=64 << 20)


class ProcessStartRequest(BaseModel):
    """``POST /v1/sandboxes/{id}/processes``: run ``cmd`` with ``/bin/sh -c`` in the background.

    ``stdin`` keeps a pipe to its standard input open (``…/stdin`` writes to it); otherwise it reads
    ``/dev/null``. With ``pty`` it runs on a terminal of that size (its output is the ``pty`` stream).
    """

    model_config = ConfigDict(extra="forbid")
    cmd: str = Field(min_length=1, max_length=1 << 20)
    env: Env = Field(default_factory=dict)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)
    tag: str | None = Field(default=None, min_length=1, max_length=256)
    stdin: bool = False
    pty: ProcessPty | None = None


class ExecResponse(BaseModel):
    stdout: str
    stderr: str
    exit_code: int
    duration_ms: float


class FileEntry(BaseModel):
    name: str
    is_dir: bool
    size: int
    mode: int
    mtime: float


class DirListing(BaseModel):
    path: str
    entries: list[FileEntry]


class WriteResult(BaseModel):
    path: str
    bytes: int


FileOperation = Literal["read", "write"]


class FileUrlRequest(BaseModel):
    """``POST /v1/sandboxes/{id}/files/url``: a URL that reads (``read``: ``GET``) or writes (``write``: ``PUT`` of
    the raw body, parents created) one guest file with no API key, for ``expires_in`` seconds (1 to 7 days)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=4096)
    """An absolute path inside the guest."""
    operation: FileOperation
    expires_in: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    user: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[^/:\x00]+$")
    """The guest user a write's file belongs to (``write`` only; by default the guest agent's)."""


class FileUrl(BaseModel):
    url: str
    """Absolute, on the base URL the request came to; its query carries the signature."""
    method: Literal["GET", "PUT"]
    expires_at: str


class Template(BaseModel):
    name: str
    cpu: int
    memory_mb: int
    generation: str
    status: Literal["ready", "building", "error"]
    created_at: str
    progress: str | None = None
    error: str | None = None
    build_id: str | None = None
    """The latest build from a Dockerfile or an image (``POST /v1/templates/build``), if any."""
    failed_step: FailedStep | None = None
    """Where that build stopped, if it failed (the template may still be ``ready`` from an earlier build)."""


class TemplateCreateRequest(BaseModel):
    """A custom template: a built-in's image plus Debian packages, pip packages, files and warm-up commands."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    base: Literal["base", "code-interpreter"] = "base"
    packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]{0,99}$")]] = Field(
        default_factory=list, max_length=64
    )
    pip: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\[\],<>=!~-]{0,199}$")]] = Field(
        default_factory=list, max_length=64
    )
    files: dict[Annotated[str, Field(pattern=r"^/[^\x00]{1,4095}$")], str] = Field(default_factory=dict)
    warmup: list[Annotated[str, Field(min_length=1, max_length=65536)]] = Field(default_factory=list, max_length=32)
    cpu: int | None = Field(default=None, ge=1, le=8)
    memory_mb: int | None = Field(default=None, ge=256, le=16384)


class TemplateList(BaseModel):
    items: list[Template]


class ErrorBody(BaseModel):
    error: str
    code: str
    details: dict[str, object] = Field(default_factory=dict)


class Info(BaseModel):
    version: str
    accelerator: Literal["kvm", "tcg"]
    hosts: list[str]
    capacity: dict[str, int]
    isolation: dict[str, Any] = Field(default_factory=dict)
    """Per host: how QEMU is confined (``jail``) and what the guest-to-host boundary is (``boundary``)."""
    sandbox_domain: str | None = None
    """Where ``{port}-{sandbox_id}.{domain}`` reaches a sandbox's port (``--sandbox-domain``); None: nowhere."""


# --- snapshots and forks (SDK results; frozen dataclasses, validated from the wire by pydantic) -----------------


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a sandbox's memory and disk (``GET /v1/snapshots/{id}``).

    ``size_bytes`` is the allocated size of all its files; ``unique_bytes`` the bytes only it holds (the memory
    pages it changed from its parent image, its device state and its disk overlay); ``shared_bytes`` the memory it
    shares with its parent image (a template generation or another snapshot; both 0 from a server that predates
    them); ``retain`` keeps it when its sandbox is deleted;
    ``parent_id`` is the snapshot it was taken on top of, if any; ``pause_ms`` how long the sandbox was paused;
    ``location`` is ``local`` until the snapshot is in the object store (``stored``: restorable on any host).
    """

    id: str
    sandbox_id: str | None
    """``None`` for an imported snapshot (its sandbox ran on another installation)."""
    template: str
    size_bytes: int
    created_at: datetime
    labels: dict[str, str] = field(default_factory=dict)
    retain: bool = False
    parent_id: str | None = None
    pause_ms: float | None = None
    location: str = "local"
    host: str | None = None
    unique_bytes: int = 0
    shared_bytes: int = 0


@dataclass(frozen=True)
class ForkTreeError:
    """A child of a fork tree that could not be created: ``index`` among the ``count`` asked for."""

    index: int
    error: str


@dataclass(frozen=True)
class PromoteFailure:
    """A sibling that ``promote`` could not delete."""

    id: str
    error: str


@dataclass(frozen=True)
class PromoteResult:
    """``POST /v1/sandboxes/{id}/promote``: the ``winner`` of ``tree_id`` and the siblings deleted (or not)."""

    winner: str
    tree_id: str
    deleted: list[str] = field(default_factory=list)
    failures: list[PromoteFailure] = field(default_factory=list)
