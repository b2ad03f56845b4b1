"""The images of the volumes this host holds: ``<volume>/volumes/<id>.ext4``, one sparse file each.

A new image is made by the agent (``truncate`` to the size, then ``mkfs.ext4`` on the file it just made, so the
host only ever formats bytes it wrote itself); after that the image is the tenant's, and the host never parses it:
it is not mounted on the host, never fsck'd or resized there. Growing a volume grows the file only; the guest
grows the file system when it next mounts the volume (``resize2fs`` on its own block device). Shrinking is refused.
Images live on the data volume (reflink clones for forks, like disks) and are opened by QEMU only through a file
descriptor the agent hands it (the jail binds nothing of this directory).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ...agentapi.models_volumes import VOLUME_ID, VolumeInfo, VolumeSpec
from ...errors import InvalidArgument, NotFound, StateError

Runner = Callable[[Sequence[str]], Awaitable[None]]
"""Run a command to completion; raises on a non-zero exit."""


async def run_checked(argv: Sequence[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {out.decode(errors='replace')[-2000:]}")


class VolumeStore:
    def __init__(self, root: Path, run: Runner = run_checked) -> None:
        self.root = root
        self._run = run

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
        return VolumeInfo(volume_id=volume_id, size_bytes=st.st_size, allocated_bytes=st.st_blocks * 512)

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
        partial = path.with_suffix(".partial")
        try:
            with open(partial, "wb") as f:
                f.truncate(spec.size_bytes)
            await self._run(
                ["mkfs.ext4", "-F", "-q", "-L", spec.label, "-E", f"root_owner={spec.owner_uid}:{spec.owner_uid}"]
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
            with open(self.path(volume_id), "r+b") as f:
                f.truncate(size_bytes)
                os.fsync(f.fileno())
        return self.info(volume_id)

    def delete(self, volume_id: str, *, in_use: bool = False) -> None:
        """Remove the image (idempotent); 409 while a VM of this host has it attached."""
        if in_use:
            raise StateError(f"volume {volume_id} is attached here", state="attached", required="detached")
        self.path(volume_id).unlink(missing_ok=True)
