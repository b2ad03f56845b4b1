"""Wire models of volumes (``/v1/volumes``, PandaStack's shapes: a volume is named by its ``name`` in the
workspace; ``size_mb``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIN_SIZE_MB = 16
NAME_CHARS = r"[A-Za-z0-9._-]{1,64}"
"""A volume's name (PandaStack's rule; E2B's ``[A-Za-z0-9_-]+`` is inside it): the one rule of the server, the
SDK and the CLI."""
NAME_PATTERN = f"^{NAME_CHARS}$"
MAX_SIZE_MB = 1 << 20


class CreateVolumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    size_mb: int = Field(default=1024, ge=MIN_SIZE_MB, le=MAX_SIZE_MB)
    """MiB (default 1 GiB)."""


class ResizeVolumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size_mb: int = Field(ge=MIN_SIZE_MB, le=MAX_SIZE_MB)
    """The new size in MiB: at least the current one (volumes only grow)."""


class VolumeMount(BaseModel):
    sandbox_id: str
    path: str
    read_only: bool


class SandboxVolume(BaseModel):
    """One of a sandbox's mounts, as its view shows it: volume ``name`` at ``path``."""

    name: str
    path: str
    read_only: bool


class Volume(BaseModel):
    id: str
    name: str
    size_mb: int
    size_bytes: int
    used_bytes: int | None = None
    """What its file system uses, as its superblock says (the guest updates that at unmount: while a sandbox has
    it, the figure is from its last unmount); ``null`` when its agent does not answer."""
    filesystem: str = "ext4"
    status: str
    host: str | None = None
    attached_to: list[VolumeMount] = Field(default_factory=list)
    created_at: str
    stored_at: str | None = None
    """When its image was last copied to the object store (a move, a restore's source); ``null``: never."""


class VolumeRestored(BaseModel):
    """``POST /v1/volumes/{name}/restore``: the volume, back on a live host from its last stored copy."""

    volume: Volume
    lost_host: str
    """The host it was lost on; if it returns, its copy is stale and no longer the volume's."""
    restored_from: str
    """When the copy was stored: writes made on ``lost_host`` after this are lost."""
    message: str


class VolumeList(BaseModel):
    items: list[Volume]


class VolumeMountRequest(BaseModel):
    """A create's volume: ``name`` in the workspace, mounted at ``path`` (default ``/mnt/<name>``; PandaStack's SDK
    sends none), read-write unless ``read_only`` (one read-write mount per volume at a time, any number of
    read-only ones)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    path: str | None = Field(default=None, min_length=2, max_length=4096)
    read_only: bool = Field(default=False, alias="readOnly")

    @property
    def mount_path(self) -> str:
        return self.path if self.path is not None else f"/mnt/{self.name}"


class VolumeEntry(BaseModel):
    """A file, directory or symlink in a volume (``/v1/volumes/{name}/…``; E2B's ``VolumeEntryStat``): ``path``
    absolute in the volume, times in RFC 3339."""

    name: str
    type: str
    """``file``, ``directory``, ``symlink`` or ``unknown``."""
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: str
    mtime: str
    ctime: str
    target: str | None = None
    """A symlink's target (never followed)."""


class VolumeEntryList(BaseModel):
    items: list[VolumeEntry]
