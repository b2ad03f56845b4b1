"""The images of the volumes this host holds: ``<volume>/volumes/<id>.ext4``, one file each.

A new image is made by the agent (the file allocated to its full size, then ``mkfs.ext4`` on the file it just
made, so the host only ever formats bytes it wrote itself); after that the image is the tenant's, and the host
never parses it: it is not mounted on the host, never fsck'd or resized there. The only thing read from it is four
integers of the ext4 superblock (:func:`used_bytes`). Images are allocated in full (``posix_fallocate``, unwritten
extents: instant on XFS), so a guest filling its volume gets ENOSPC from its own file system and can never fill
the host's disk; a create or a growth the data volume has no room for is refused (503) before anything is made.
Growing a volume grows the file only; the guest grows the file system when it next mounts the volume
(``resize2fs`` on its own block device). Shrinking is refused. Images live on the data volume (reflink clones for
forks, like disks) and are opened by QEMU only through a file descriptor the agent hands it (the jail binds
nothing of this directory).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ...agentapi.models_volumes import VOLUME_ID, VolumeInfo, VolumeSpec
from ...errors import HostUnavailable, InvalidArgument, NotFound, StateError

EXT4_MAGIC = 0xEF53
HEADROOM_BYTES = 1 << 30
"""What the data volume keeps free beyond a new image (snapshots, overlays and records need room too)."""

Runner = Callable[[Sequence[str]], Awaitable[None]]
"""Run a command to completion; raises on a non-zero exit."""


async def run_checked(argv: Sequence[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {out.decode(errors='replace')[-2000:]}")


def used_bytes(path: Path) -> int | None:
    """The bytes an image's ext4 file system uses, from its superblock (block count minus free blocks, times the
    block size: as the guest last wrote them there, e.g. at its last unmount); ``None`` when the superblock is not
    ext4's. Four little-endian integers at fixed offsets: nothing of the tenant's file system is parsed."""
    try:
        with open(path, "rb") as f:
            f.seek(1024)
            sb = f.read(1024)
    except OSError:
        return None
    if len(sb) < 1024 or int.from_bytes(sb[0x38:0x3A], "little") != EXT4_MAGIC:
        return None
    blocks = int.from_bytes(sb[0x04:0x08], "little") | (int.from_bytes(sb[0x150:0x154], "little") << 32)
    free = int.from_bytes(sb[0x0C:0x10], "little") | (int.from_bytes(sb[0x158:0x15C], "little") << 32)
    log_block = int.from_bytes(sb[0x18:0x1C], "little")
    if log_block > 6 or free > blocks:
        return None
    return (blocks - free) * (1024 << log_block)


class VolumeStore:
    def __init__(self, root: Path, run: Runner = run_checked, *, swept: bool = False) -> None:
        """``swept``: remove what a crash left of fetches and creates first (hidden temporary images,
        ``*.partial``): an agent starting holds no fetch in progress."""
        self.root = root
        self._run = run
        if swept and root.is_dir():
            for path in [*root.glob(".*"), *root.glob("*.partial")]:
                if path.is_file():
                    path.unlink(missing_ok=True)

    def path(self, volume_id: str) -> Path:
        if not VOLUME_ID.match(volume_id):
            raise InvalidArgument(f"not a volume id: {volume_id[:80]!r}", details={"volume_id": volume_id[:80]})
        return self.root / f"{volume_id}.ext4"

    def info(self, volume_id: str) -> VolumeInfo:
        path = self.path(volume_id)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise NotFound(f"volume {volume_id} is not on this host", details={"volume_id": volume_id}) from None
        return VolumeInfo(
            volume_id=volume_id,
            size_bytes=st.st_size,
            allocated_bytes=st.st_blocks * 512,
            used_bytes=used_bytes(path),
        )

    def ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("vol-*.ext4") if VOLUME_ID.match(p.stem))

    async def create(self, spec: VolumeSpec) -> VolumeInfo:
        """Make the image (idempotent for a retried call: an image that is there is answered as it is). A failed
        format leaves nothing."""
        path = self.path(spec.volume_id)
        if path.exists():
            return self.info(spec.volume_id)
        self.root.mkdir(parents=True, exist_ok=True)
        self.room_for(spec.size_bytes)
        partial = path.with_suffix(".partial")
        try:
            with open(partial, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, spec.size_bytes)
            await self._run(
                [
                    "mkfs.ext4",
                    "-F",
                    "-q",
                    "-L",
                    spec.label,
                    "-E",
                    f"nodiscard,root_owner={spec.owner_uid}:{spec.owner_uid}",
                ]
                + [str(partial)]
            )
            fd = os.open(partial, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            partial.rename(path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return self.info(spec.volume_id)

    def grow(self, volume_id: str, size_bytes: int) -> VolumeInfo:
        """Grow the image to ``size_bytes`` (the same size: nothing); smaller is refused with 400."""
        current = self.info(volume_id)
        if size_bytes < current.size_bytes:
            raise InvalidArgument(
                f"a volume only grows: {size_bytes} bytes is less than its {current.size_bytes}",
                details={"size_bytes": size_bytes, "current_bytes": current.size_bytes},
            )
        if size_bytes > current.size_bytes:
            self.room_for(size_bytes - current.size_bytes)
            with open(self.path(volume_id), "r+b") as f:
                os.posix_fallocate(f.fileno(), 0, size_bytes)
                os.fsync(f.fileno())
        return self.info(volume_id)

    def room_for(self, size_bytes: int) -> None:
        """503 unless the data volume has room for ``size_bytes`` more (plus the headroom)."""
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if free < size_bytes + HEADROOM_BYTES:
            raise HostUnavailable(
                f"this host's data volume has {free >> 20} MiB free: no room for {size_bytes >> 20} MiB more",
                retry_after_s=60.0,
                details={"free_bytes": free, "requested_bytes": size_bytes},
            )

    def new_path(self, volume_id: str) -> Path:
        """Where new volume ``volume_id``'s image goes (a clone's): 409 when this host has an image of that id."""
        path = self.path(volume_id)
        if path.exists():
            raise StateError(f"volume {volume_id} exists on this host already", state="exists", required="absent")
        self.root.mkdir(parents=True, exist_ok=True)
        return path

    def delete(self, volume_id: str, *, in_use: bool = False) -> None:
        """Remove the image (idempotent); 409 while a VM of this host has it attached."""
        if in_use:
            raise StateError(f"volume {volume_id} is attached here", state="attached", required="detached")
        self.path(volume_id).unlink(missing_ok=True)
