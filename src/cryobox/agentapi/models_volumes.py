"""Wire models of volumes on an agent: the image it holds for each (a file of the volume's size carrying an ext4
file system), made, grown and removed on the control plane's word. Kept apart from :mod:`.models`."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

VOLUME_ID = re.compile(r"^vol-[0-9a-f]{12}$")
MIN_VOLUME_BYTES = 16 << 20
"""ext4 with a journal needs a few MiB; below this a volume is of no use."""
MAX_VOLUME_BYTES = 1 << 40


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VolumeSpec(_Model):
    """Make volume ``volume_id``: a sparse file of ``size_bytes`` with an ext4 file system labelled ``label``."""

    volume_id: str = Field(pattern=VOLUME_ID.pattern)
    size_bytes: int = Field(ge=MIN_VOLUME_BYTES, le=MAX_VOLUME_BYTES)
    label: str = Field(min_length=1, max_length=16, pattern=r"^[A-Za-z0-9._-]+$")
    owner_uid: int = Field(default=1000, ge=0, le=65535)
    """Who owns the file system's root directory (the guest's default user, ``user``: uid 1000)."""


class VolumeResize(_Model):
    size_bytes: int = Field(ge=MIN_VOLUME_BYTES, le=MAX_VOLUME_BYTES)


class VolumeInfo(_Model):
    volume_id: str
    size_bytes: int
    """The image's size: what the guest's block device holds."""
    allocated_bytes: int
    """What the image takes on the host's disk (allocated in full)."""
    used_bytes: int | None = None
    """What its file system uses, from its superblock (as of the guest's last write of it: its last unmount);
    ``None`` when that cannot be read."""


class VolumeMount(_Model):
    """A volume a new sandbox gets, mounted at ``path`` in the guest; its image is on the sandbox's agent."""

    volume_id: str = Field(pattern=VOLUME_ID.pattern)
    path: str = Field(min_length=2, max_length=4096, pattern=r"^/")
    read_only: bool = False


SHA256 = r"^[0-9a-f]{64}$"


class StoredVolume(_Model):
    """A volume's image in the object store (``volumes/<volume_id>/``): its index of content-addressed chunks and
    its manifest, whose sha256 the registry pins (:class:`VolumeFetch`)."""

    volume_id: str
    key: str
    """The store prefix (``volumes/<volume_id>``)."""
    manifest_sha256: str
    size_bytes: int
    """The image's size."""
    stored_bytes: int
    """Its non-zero chunks' bytes: what the store holds of it."""
    uploaded_bytes: int
    """What this store uploaded: the chunks the store lacked (an unchanged image: 0)."""
    chunks_put: int = 0
    chunks_reused: int = 0
    seconds: float = 0.0


class VolumeFetch(_Model):
    """Materialize volume ``volume_id`` on this host from ``volumes/<volume_id>/``; the stored manifest must hash
    to ``manifest_sha256`` (the registry's pin) before anything of it is parsed."""

    volume_id: str = Field(pattern=VOLUME_ID.pattern)
    manifest_sha256: str = Field(pattern=SHA256)


class ChildVolume(VolumeMount):
    """A volume a fork child gets. With ``clone_of``, ``volume_id`` is a new volume (its row written already):
    the agent makes its image a copy-on-write clone of volume ``clone_of``'s (the parent's) while the parent's
    file system cannot change under it, and removes it again if the child fails."""

    clone_of: str | None = Field(default=None, pattern=VOLUME_ID.pattern)
