"""Volumes let go of for a snapshot and mounted again after it: the ``volumes_release`` and ``volumes_mount`` ops.

A snapshot records a sandbox's mounts, not its volumes' bytes (docs/design/volumes.md). Before the host captures
the VM it has the guest release every volume, so the memory it captures holds no state of those file systems
(no superblock, inode, dentry or cached block of theirs); a restore mounts whatever the volume holds by then.

``volumes_release`` ``{"volumes": [<resume's volume objects>], "disks": [{"serial", "device", "sectors"}]}``
(``disks``: volumes the platform attached without mounting them):

1. ``sync()``;
2. each mounted path is unmounted, deepest first, with a plain umount(2), never a lazy one (that would keep the
   file system alive in memory for whoever still uses it). A path that is not mounted (the guest unmounted it
   itself) is skipped, and not mounted again afterwards;
3. each volume's disk is claimed: an exclusive open, which fails while a file system on it is still mounted
   anywhere (a bind mount, another mount namespace), then ``BLKFLSBUF`` drops its cached blocks.

The first failure (EBUSY: a process's working directory or an open file on the path) stops it: what it unmounted
is mounted again, shallowest first, and it answers ``{"ok": false, "step": "umount" | "claim", "path", "serial",
"device", "error"}``; the guest is as it was. Otherwise ``{"ok": true, "released": [the paths it unmounted], "ms"}``.

``volumes_mount`` ``{"volumes": [...]}`` mounts them as ``resume`` does (shallowest first) and answers
``{"volumes": [one result per volume, in the order given, as resume's]}``.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .ops_files import OpError, invalid
from .ops_volumes import (
    MAX_VOLUMES,
    VolumeMount,
    VolumeSystem,
    describe,
    find_disk,
    mount_volumes,
    parse_disk,
    parse_mounts,
)

NOT_MOUNTED = (errno.EINVAL, errno.ENOENT)
"""umount(2) of a path that is not a mount point (or does not exist)."""


def _depth(mount: VolumeMount) -> int:
    return mount.path.count("/")


def parse_disks(value: object) -> tuple[VolumeMount, ...]:
    """``volumes_release``'s ``disks`` (absent: none). :raises OpError: ``invalid_argument``."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_VOLUMES:
        raise invalid(f"'disks' must be a list of at most {MAX_VOLUMES} objects")
    return tuple(parse_disk(item, with_path=False) for item in value)


class VolumeHolds:
    """The ``volumes_release`` and ``volumes_mount`` ops (one at a time)."""

    def __init__(self, system: VolumeSystem | None = None) -> None:
        self.system = system or VolumeSystem()
        self._lock = threading.Lock()

    def release_op(self, args: dict[str, Any], emit: Callable[[str, bytes], None]) -> dict[str, Any]:
        mounts, disks = parse_mounts(args.get("volumes")), parse_disks(args.get("disks"))
        with self._lock:
            return self.release(mounts, disks)

    def mount_op(self, args: dict[str, Any], emit: Callable[[str, bytes], None]) -> dict[str, Any]:
        mounts = parse_mounts(args.get("volumes"))
        with self._lock:
            done = mount_volumes(tuple(sorted(mounts, key=_depth)), self.system)
        by_path = {result["path"]: result for result in done}
        return {"volumes": [by_path[m.path] for m in mounts]}

    def release(self, mounts: Sequence[VolumeMount], disks: Sequence[VolumeMount]) -> dict[str, Any]:
        started = time.perf_counter()
        system = self.system
        try:
            system.sync()
        except OSError as err:
            raise OpError("internal", f"sync: {err}") from err
        unmounted: list[VolumeMount] = []
        for mount in sorted(mounts, key=_depth, reverse=True):
            try:
                system.umount(mount.path)
            except OSError as err:
                if err.errno in NOT_MOUNTED:
                    continue
                return self._undo(unmounted, mount, "", "umount", err)
            unmounted.append(mount)
        for mount in (*mounts, *disks):
            disk = ""
            try:
                disk = find_disk(mount, system)
                system.claim(f"{system.dev_dir}/{disk}")
            except OSError as err:
                return self._undo(unmounted, mount, disk, "claim", err)
        ms = round((time.perf_counter() - started) * 1000, 3)
        return {"ok": True, "released": [m.path for m in unmounted], "ms": ms}

    def _undo(
        self, unmounted: list[VolumeMount], failed: VolumeMount, disk: str, step: str, err: OSError
    ) -> dict[str, Any]:
        """Mount again what was unmounted (shallowest first) and report what could not be released."""
        again = mount_volumes(tuple(reversed(unmounted)), self.system)
        reply: dict[str, Any] = {
            "ok": False,
            "step": step,
            "path": failed.path or None,
            "serial": failed.serial,
            "device": disk or failed.device,
            "error": describe(err),
        }
        broken = {r["path"]: r["error"] for r in again if not r["ok"]}
        if broken:
            reply["remount_errors"] = broken
        return reply
