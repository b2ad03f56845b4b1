"""A pool VM's volume warm-up: mount and unmount a throwaway ext4 once before the VM waits in the pool.

Under TCG the first run of any guest kernel path in a new QEMU process pays for its translation. A create's
volume mount runs paths no restore has run yet (virtio-blk's serial request, ext4's mkdir, mount and journal
load): measured in a warm pool VM, mounting one volume took 60-90 ms cold against 6-18 ms once those paths had run
in that QEMU. So the warm step (``factory.warm``: it already runs ``exec true`` and a ``resume`` for the same
reason) attaches a private copy of a small ext4 image to the VM's last read-write slot, has the guest mount it in
its ``resume`` call (the create's own path), unmount it and remove its mount point, then points the slot back at
its empty node with capacity 0 (:func:`.volumes.detach_volumes`): a sandbox taken from the pool sees empty slots,
as baked. The image is a memfd per VM (nothing is shared, so no lock is contended and nothing is left); only
what ``mkfs.ext4`` wrote is copied into it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ...errors import VmmError
from .volumes import VolumeAttach

log = logging.getLogger(__name__)
WARMUP_BYTES = 16 << 20
WARMUP_MOUNT = "/.cryobox-volume-warmup"
IMAGE_NAME = "volume-warmup-1.ext4"
CHUNK = 64 << 10


def ensure_image(images_dir: Path) -> Path | None:
    """The warm-up image under ``images_dir`` (made once: ``mkfs.ext4`` on a sparse file, renamed into place),
    or ``None`` when this host has no ``mkfs.ext4`` (pool VMs are then not warmed for volumes)."""
    image = images_dir / IMAGE_NAME
    if image.exists():
        return image
    mkfs = shutil.which("mkfs.ext4")
    if mkfs is None:
        log.warning("no mkfs.ext4 on this host: pool VMs are not warmed for volumes (their first mount is cold)")
        return None
    images_dir.mkdir(parents=True, exist_ok=True)
    tmp = images_dir / f".{IMAGE_NAME}.{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.truncate(WARMUP_BYTES)
        out = subprocess.run([mkfs, "-q", "-F", "-L", "cryobox-warmup", str(tmp)], capture_output=True, text=True)
        if out.returncode != 0:
            raise VmmError(f"mkfs.ext4 of the volume warm-up image failed: {out.stderr.strip()}")
        tmp.chmod(0o444)
        tmp.replace(image)
    finally:
        tmp.unlink(missing_ok=True)
    return image


@dataclass(frozen=True)
class WarmupData:
    """The warm-up image's non-zero 64 KiB chunks, read once (a few of them: ``mkfs.ext4`` writes ~400 KiB of its
    16 MiB): copying the whole image for every pool VM held the GIL ~12 ms beside the event loop's requests."""

    size: int
    chunks: tuple[tuple[int, bytes], ...]

    @classmethod
    def read(cls, image: Path) -> WarmupData:
        chunks: list[tuple[int, bytes]] = []
        with open(image, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            offset = 0
            while chunk := src.read(CHUNK):
                if chunk.count(0) != len(chunk):
                    chunks.append((offset, chunk))
                offset += len(chunk)
        return cls(size, tuple(chunks))


def private_copy(data: WarmupData) -> int:
    """A memfd holding the image (its data chunks; the rest stays a hole). The caller closes it."""
    fd = os.memfd_create("cryobox-volume-warmup", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, data.size)
        for offset, chunk in data.chunks:
            os.pwrite(fd, chunk, offset)
    except BaseException:
        os.close(fd)
        raise
    return fd


def warmup_volume(image: Path) -> VolumeAttach:
    """How the warm-up image is attached: read-write (the create path's longest mount), at :data:`WARMUP_MOUNT`."""
    return VolumeAttach(image, read_only=False, mount_path=WARMUP_MOUNT, name="warm-up")
