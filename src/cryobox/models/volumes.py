"""Wire models of volumes (``/v1/volumes``, PandaStack's shapes: a volume is named by its ``name`` in the
workspace; ``size_mb``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIN_SIZE_MB = 16
MAX_SIZE_MB = 1 << 20


class CreateVolumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
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


class Volume(BaseModel):
    id: str
    name: str
    size_mb: int
    size_bytes: int
    used_bytes: int | None = None
    """What its image takes on the host (the blocks ever written, file system metadata included); ``null`` when
    its agent does not answer."""
    filesystem: str = "ext4"
    status: str
    host: str | None = None
    attached_to: list[VolumeMount] = Field(default_factory=list)
    created_at: str


class VolumeList(BaseModel):
    items: list[Volume]
