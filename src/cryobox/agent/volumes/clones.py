"""Copy-on-write clones of volume images for fork children: a new volume whose image starts as another's bytes.

A clone is made while the source's file system cannot change under it: for ``fork_tree`` while the parent's guest
has released its volumes for the capture (so the clone is a cleanly unmounted file system), for ``fork`` inside the
parent's pause, like its disk (crash-consistent: the child's mount replays the journal). It is a reflink
(``FICLONE``: instant, the blocks shared until either side writes them) where the data volume can, else a sparse
copy (:func:`..disk.volume.clone_file`), then allocated in full (``posix_fallocate``: nothing for shared extents,
the holes of a copy). Shared blocks take room again when written, so the host checks room for every clone's full
size before it makes any (:meth:`.store.VolumeStore.room_for`); unlike a new image, a clone's later writes are not
reserved up front (the same trade-off as a fork's disk clone).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..disk.volume import clone_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VolumeClone:
    """Make image ``target`` (a new volume's) a copy-on-write clone of image ``source``."""

    source: Path
    target: Path


def make_clones(clones: Sequence[VolumeClone]) -> list[str]:
    """Make every clone (blocking; ``"reflink"`` or ``"copy"`` for each). On a failure the clones made so far are
    removed and the error raised: all or nothing."""
    methods: list[str] = []
    try:
        for clone in clones:
            methods.append(clone_file(clone.source, clone.target))
            fd = os.open(clone.target, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException:
        drop_clones(clones)
        raise
    return methods


def drop_clones(clones: Sequence[VolumeClone]) -> None:
    """Remove the clones' images (idempotent): a child that failed keeps nothing of them."""
    for clone in clones:
        try:
            clone.target.unlink(missing_ok=True)
        except OSError as err:
            log.warning("could not remove the volume clone %s: %s", clone.target, err)
