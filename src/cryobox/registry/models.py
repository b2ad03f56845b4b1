"""ORM tables of the registry (SQLAlchemy 2 typed declarative).

The schema is created and changed only by the Alembic revisions in ``migrations/versions``; these classes must
stay in step with them (a unit test compares the migrated database with this metadata). Timestamps are float
epoch seconds; JSON columns use the generic ``JSON`` type, which works on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Double, ForeignKey, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy import true as sa_true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID = String(128)
NAME = String(255)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Workspace(Base):
    __tablename__ = "workspaces"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(NAME, unique=True)
    created_at: Mapped[float] = mapped_column(Double)


class WorkspaceQuota(Base):
    """A workspace's own limits (revision 0006); a NULL column means the server default (``CRYOBOX_QUOTA_*``)."""

    __tablename__ = "workspace_quotas"

    workspace_id: Mapped[str] = mapped_column(ID, ForeignKey("workspaces.id"), primary_key=True)
    sandboxes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    vcpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    memory_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    snapshot_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    templates: Mapped[int | None] = mapped_column(Integer, nullable=True)
    default_ttl_s: Mapped[int | None] = mapped_column(Integer, nullable=True)  # 0: no default TTL
    max_ttl_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    hibernated: Mapped[int | None] = mapped_column(Integer, nullable=True)  # revision 0013
    volumes: Mapped[int | None] = mapped_column(Integer, nullable=True)  # revision 0014
    volume_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # revision 0014
    updated_at: Mapped[float] = mapped_column(Double)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ID, ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(NAME)
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)


class ConsoleSession(Base):
    """A web console login (revision 0009): the cookie's token only as its SHA-256, bound to the API key that
    logged in (a revoked key ends its sessions); ``ended_at`` is set by logout."""

    __tablename__ = "console_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(ID, ForeignKey("api_keys.id"), index=True)
    workspace_id: Mapped[str] = mapped_column(ID, ForeignKey("workspaces.id"))
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class Template(Base):
    __tablename__ = "templates"

    name: Mapped[str] = mapped_column(NAME, primary_key=True)
    generation: Mapped[str] = mapped_column(NAME)
    # attributes in the house's units; the columns keep the names the migrations gave them
    cpus: Mapped[int] = mapped_column("cpu", Integer)
    memory_mib: Mapped[int] = mapped_column("memory_mb", Integer)
    status: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Double)
    # custom templates (revision 0002): owner (NULL = built-in, visible to all), build spec, last build error
    workspace_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class TemplateBuild(Base):
    """A recipe build of a custom template (revision 0010); kept after the build, also when a failed first build
    left no template behind."""

    __tablename__ = "template_builds"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(String(128))
    template: Mapped[str] = mapped_column(NAME, index=True)
    status: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_step: Mapped[str | None] = mapped_column(String(32), nullable=True)
    tags: Mapped[list[str]] = mapped_column(JSON)
    cpus: Mapped[int] = mapped_column("cpu", Integer)
    memory_mib: Mapped[int] = mapped_column("memory_mb", Integer)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    log_lines: Mapped[int] = mapped_column(Integer)
    log_truncated: Mapped[bool] = mapped_column(Boolean)
    # revision 0011: refreshed by the control plane running the build (its heartbeat); stale = that one stopped
    updated_at: Mapped[float] = mapped_column(Double, server_default="0")


class TemplateBuildLog(Base):
    """One log line of a build (revision 0010), ``seq`` from 0."""

    __tablename__ = "template_build_logs"

    build_id: Mapped[str] = mapped_column(String(64), ForeignKey("template_builds.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    timestamp: Mapped[float] = mapped_column(Double)
    level: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    step: Mapped[str] = mapped_column(String(32))


class TemplateFile(Base):
    """A workspace's uploaded context blob under the client's own files hash (revision 0010)."""

    __tablename__ = "template_files"

    workspace_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    files_hash: Mapped[str] = mapped_column(String(128), primary_key=True)
    blob_sha256: Mapped[str] = mapped_column(String(64), index=True)
    template: Mapped[str] = mapped_column(NAME)
    created_at: Mapped[float] = mapped_column(Double)


class Sandbox(Base):
    __tablename__ = "sandboxes"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ID, ForeignKey("workspaces.id"), index=True)
    template: Mapped[str] = mapped_column(NAME)
    cpus: Mapped[int] = mapped_column("cpu", Integer)
    memory_mib: Mapped[int] = mapped_column("memory_mb", Integer)
    status: Mapped[str] = mapped_column(String(32), index=True)
    # ``metadata`` is reserved on declarative classes: the attribute is ``metadata_``, the column "metadata"
    metadata_: Mapped[dict[str, str]] = mapped_column("metadata", JSON)
    # a sealed token (a JSON string, ``envseal``); a plain mapping in rows written before sealing existed
    env: Mapped[str | dict[str, str]] = mapped_column(JSON)
    from_snapshot: Mapped[str | None] = mapped_column(ID)
    boot_ms: Mapped[float] = mapped_column(Double)
    boot_mode: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(NAME, index=True)  # indexed since revision 0004 (per-host reconcile)
    created_at: Mapped[float] = mapped_column(Double)
    persistent: Mapped[bool] = mapped_column(Boolean)
    ttl_s: Mapped[int | None] = mapped_column("ttl_seconds", Integer)
    expires_at: Mapped[float | None] = mapped_column(Double)
    last_active_at: Mapped[float] = mapped_column(Double)
    vm_id: Mapped[str | None] = mapped_column(ID)
    guest_ip: Mapped[str | None] = mapped_column(String(64))
    instance_id: Mapped[str | None] = mapped_column(String(64))
    # portable hibernation (revision 0005): ``local`` (the image is on ``host`` only) or ``stored`` (in the object
    # store too, so any agent serving ``hibernation_generation`` can wake it); the network policy (a mapping,
    # ``EgressPolicy``; a list of CIDRs in rows of before policies; NULL: nothing allowed)
    hibernation: Mapped[str | None] = mapped_column(String(32), nullable=True)
    hibernation_generation: Mapped[str | None] = mapped_column(NAME, nullable=True)
    egress: Mapped[dict[str, Any] | list[str] | None] = mapped_column(JSON, nullable=True)
    # the sha256 of the stored hibernation's manifest (revision 0007; NULL: stored before manifests were pinned)
    hibernation_manifest_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # timeout actions (revision 0013): what the TTL's expiry does, whether requests wake it, since when hibernated
    on_timeout: Mapped[str] = mapped_column(String(16), server_default="kill")
    auto_wake: Mapped[bool] = mapped_column(Boolean, server_default=sa_true())
    hibernated_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class Snapshot(Base):
    __tablename__ = "snapshots"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ID, ForeignKey("workspaces.id"), index=True)
    # not a foreign key: the sandbox row may be deleted while its snapshots stay
    sandbox_id: Mapped[str | None] = mapped_column(ID, index=True)
    template: Mapped[str] = mapped_column(NAME)
    parent_id: Mapped[str | None] = mapped_column(ID)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    # revision 0008: what only it holds (changed memory pages, device state, disk overlay) and the memory it
    # shares with its parent image (a template generation or another snapshot)
    unique_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")
    shared_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")
    pause_ms: Mapped[float | None] = mapped_column(Double)
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    retain: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[float] = mapped_column(Double)
    orphaned_at: Mapped[float | None] = mapped_column(Double)
    # fleet (revision 0004): the agent that wrote it, whether its files are only there (``local``) or in the
    # object store (``stored``), and the template generation it was taken from
    host: Mapped[str] = mapped_column(NAME, server_default="")
    location: Mapped[str] = mapped_column(String(32), server_default="local")
    generation: Mapped[str | None] = mapped_column(NAME, nullable=True)
    # the sha256 of its manifest in the object store (revision 0007; NULL: not stored, or before pinning)
    manifest_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # the network policy of the sandbox it was taken from (revision 0012; NULL: nothing allowed, or from before)
    egress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the volume mounts of the sandbox it was taken from (revision 0014), not their bytes
    volumes: Mapped[list[dict[str, Any]]] = mapped_column(JSON, server_default="[]")


class Agent(Base):
    """A host agent as its heartbeats describe it (revision 0004)."""

    __tablename__ = "agents"

    name: Mapped[str] = mapped_column(NAME, primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    boot_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32))  # up | down | draining
    heartbeat_at: Mapped[float] = mapped_column(Double)
    registered_at: Mapped[float] = mapped_column(Double)
    capacity: Mapped[dict[str, Any]] = mapped_column(JSON)
    info: Mapped[dict[str, Any]] = mapped_column(JSON)


class Reservation(Base):
    """Room held on an agent between placement and the sandbox row that takes it over (revision 0004)."""

    __tablename__ = "reservations"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    agent: Mapped[str] = mapped_column(NAME, index=True)
    sandbox_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    memory_mib: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double, index=True)


class Volume(Base):
    """A named volume of a workspace, on one host at a time (revision 0014); ``writer``: the sandbox holding its
    read-write attachment."""

    __tablename__ = "volumes"
    __table_args__ = (UniqueConstraint("workspace_id", "name", name="uq_volumes_workspace_id_name"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ID, ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(NAME)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    filesystem: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(NAME, index=True)
    status: Mapped[str] = mapped_column(String(16))
    writer: Mapped[str | None] = mapped_column(ID, nullable=True)
    created_at: Mapped[float] = mapped_column(Double)
    stored_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The sha256 of the manifest of its last copy in the object store (revision 0016)."""
    stored_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    move_token: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The move lease: held by the replica that took it (no attachment is recorded meanwhile)."""
    move_target: Mapped[str | None] = mapped_column(NAME, nullable=True)
    move_started_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class VolumeAttachment(Base):
    """A sandbox's mount of a volume (revision 0014)."""

    __tablename__ = "volume_attachments"

    volume_id: Mapped[str] = mapped_column(ID, ForeignKey("volumes.id"), primary_key=True)
    sandbox_id: Mapped[str] = mapped_column(ID, primary_key=True, index=True)
    path: Mapped[str] = mapped_column(Text)
    read_only: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[float] = mapped_column(Double)


class RegistryMeta(Base):
    """Facts about the registry itself, by key (revision 0015): ``registry_id``, its identity in the object store's
    ``owners/`` (see :mod:`cryobox.objstore.owners`)."""

    __tablename__ = "registry_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
