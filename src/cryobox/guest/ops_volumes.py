"""Volumes in the guest: mount the disks the host pointed volume slots at (``resume``'s ``volumes``), and settle
them before the host kills the VM (the ``volumes_settle`` op).

The host points a baked, empty virtio disk at a volume image while the vCPUs are stopped and rings a capacity
change (``cryobox/agent/vm/volumes.py``); once the guest runs again its kernel re-reads the capacity (a workqueue
item after the config interrupt). ``resume`` mounts each volume it names right after the clock step, before any
resume hook runs, so hooks see them::

    {"serial": "cbx-vol-rw0", "device": "vdc", "sectors": 131072, "path": "/mnt/data", "read_only": false}

The disk is the host's ``device`` once its capacity reads ``sectors`` (awaited, at most :data:`CAPACITY_TIMEOUT`);
otherwise (a VM with data disks numbers its disks differently) the one whose serial is the slot's: reading a
serial is a request to the device, ~2 ms under TCG, so it is only the fallback. Then the mount point is made (mode
0755, parents too) and ext4 mounted with mount(2) itself: an exec of mount(8) costs ~40 ms under TCG, the syscall
~5.
Options: ``nosuid,nodev``; read-write adds ``noinit_itable`` (no background zeroing of a fresh filesystem's inode
tables competing with the sandbox's first commands); a read-only slot adds
``ro`` and ``noload`` (its disk refuses writes, so a journal needing recovery could not be replayed: it is
skipped, as for any read-only copy of a live ext4).

``volumes_settle`` ``{"paths": [...], "mode": "freeze" | "unmount"}`` syncs, then freezes (``FIFREEZE``: the
journal is checkpointed and the filesystem marked clean, open files or not) or unmounts each path; the host calls
it before killing a VM whose volumes stay (a delete), so an image it keeps needs no journal replay. Letting go of
every volume for a snapshot, and mounting them again, are :mod:`.ops_volume_release`'s.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import posixpath
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ops_files import OpError, invalid

MAX_VOLUMES = 16
MAX_PATH = 1024
CAPACITY_TIMEOUT = 2.0
SPIN_S = 0.01
SERIAL_RE = re.compile(r"cbx-vol-(rw|ro)[0-9]{1,2}")
DEVICE_RE = re.compile(r"vd[a-z]{1,3}")
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
FIFREEZE = 0xC0045877  # _IOWR('X', 119, int)
SETTLE_MODES = ("freeze", "unmount")


@dataclass(frozen=True)
class VolumeMount:
    serial: str
    device: str
    path: str
    read_only: bool
    sectors: int = 0
    """The capacity the host gave the disk, in 512-byte sectors (0: unknown, find it by serial)."""


def _check_path(path: object) -> str:
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or path == "/"
        or "\0" in path
        or len(path.encode()) > MAX_PATH
        or posixpath.normpath(path) != path
    ):
        raise invalid(f"volume path {path!r} must be an absolute, normalised path other than /")
    return path


def parse_mounts(value: object) -> tuple[VolumeMount, ...]:
    """``resume``'s ``volumes`` argument (absent: none). :raises OpError: ``invalid_argument``."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_VOLUMES:
        raise invalid(f"'volumes' must be a list of at most {MAX_VOLUMES} objects")
    mounts = tuple(parse_disk(item, with_path=True) for item in value)
    if len({m.path for m in mounts}) != len(mounts) or len({m.serial for m in mounts}) != len(mounts):
        raise invalid("two volumes name the same path or slot")
    return mounts


def parse_disk(item: object, *, with_path: bool) -> VolumeMount:
    """One volume of a list the host sent; without ``with_path`` a disk the platform does not mount (its
    ``path`` is ``""``). :raises OpError: ``invalid_argument``."""
    if not isinstance(item, dict):
        raise invalid("each volume must be an object")
    serial, device, read_only = item.get("serial"), item.get("device"), item.get("read_only", False)
    if not isinstance(serial, str) or not SERIAL_RE.fullmatch(serial):
        raise invalid(f"volume serial {serial!r} is not a volume slot's")
    if not isinstance(device, str) or not DEVICE_RE.fullmatch(device):
        raise invalid(f"volume device {device!r} is not a virtio disk name")
    if not isinstance(read_only, bool) or with_path and "read_only" not in item:
        raise invalid("a volume's 'read_only' must be a boolean")
    sectors = item.get("sectors", 0)
    if isinstance(sectors, bool) or not isinstance(sectors, int) or sectors < 0:
        raise invalid("a volume's 'sectors' must be a non-negative integer")
    return VolumeMount(serial, device, _check_path(item.get("path")) if with_path else "", read_only, sectors)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def sys_mount(source: str, target: str, fstype: str, flags: int, data: str | None) -> None:
    libc = _libc()
    options = data.encode() if data is not None else None
    _check(libc.mount(source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), options), "mount")


def sys_umount(target: str) -> None:
    _check(_libc().umount2(target.encode(), 0), "umount")


def sys_freeze(target: str) -> None:
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FIFREEZE, 0)
    except OSError as err:
        if err.errno != errno.EBUSY:  # frozen already
            raise
    finally:
        os.close(fd)


BLKFLSBUF = 0x1261  # _IO(0x12, 97)


def sys_claim(device: str) -> None:
    """Open block device ``device`` exclusively (EBUSY while a file system on it is mounted anywhere: another
    mount namespace, a bind mount) and drop its buffer cache, so the guest's memory keeps none of its blocks."""
    fd = os.open(device, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BLKFLSBUF, 0)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class VolumeSystem:
    """What mounting touches (the defaults act on this machine; tests replace every field)."""

    sys_block: str = "/sys/block"
    dev_dir: str = "/dev"
    mount: Callable[[str, str, str, int, str | None], None] = sys_mount
    umount: Callable[[str], None] = sys_umount
    freeze: Callable[[str], None] = sys_freeze
    claim: Callable[[str], None] = sys_claim
    sync: Callable[[], None] = os.sync
    capacity_timeout: float = CAPACITY_TIMEOUT
    sleep: Callable[[float], None] = time.sleep
    yield_cpu: Callable[[], None] = os.sched_yield


def _read(path: str) -> str:
    """A small sysfs attribute, stripped ("" if unreadable): raw os calls, a text-mode open() costs ~1 ms more
    under TCG."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 64).decode(errors="replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def _make_mount_point(path: str) -> None:
    """``path`` as a directory (mode 0755, parents too): one mkdir(2) when only the last part is missing."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, "the mount point is not a directory", path) from None
    except FileNotFoundError:
        os.makedirs(path, mode=0o755, exist_ok=True)


def _by_serial(mount: VolumeMount, system: VolumeSystem) -> str:
    for name in sorted(os.listdir(system.sys_block)):
        if name.startswith("vd") and _read(f"{system.sys_block}/{name}/serial") == mount.serial:
            return name
    raise OSError(errno.ENODEV, f"no disk has serial {mount.serial}")


def find_disk(mount: VolumeMount, system: VolumeSystem) -> str:
    """The volume's disk, once the guest sees its capacity: the host's ``device`` when its capacity is the
    volume's, else the disk with the slot's serial. :raises OSError: none, or no capacity in time."""
    started = time.monotonic()
    deadline = started + system.capacity_timeout
    hint = f"{system.sys_block}/{mount.device}/size"
    while mount.sectors:
        size = _read(hint)
        if size == str(mount.sectors):
            return mount.device
        now = time.monotonic()
        if size not in ("", "0") or now > deadline:
            break  # another disk's capacity (or none in time): look for the serial
        # the kernel worker that reads the new capacity is runnable now: let it run (a 1 ms sleep is 1-2 ms here)
        system.yield_cpu() if now - started < SPIN_S else system.sleep(0.001)
    disk = _by_serial(mount, system)
    while _read(f"{system.sys_block}/{disk}/size") in ("", "0"):
        if time.monotonic() > deadline:
            raise OSError(errno.ENOMEDIUM, f"{disk} still has no capacity after {system.capacity_timeout:.1f}s")
        system.sleep(0.001)
    return disk


def mount_one(mount: VolumeMount, system: VolumeSystem, steps: dict[str, float] | None = None) -> str:
    """Mount one volume; returns the disk it is on (``steps``: ms per step). :raises OSError:"""
    laps = steps if steps is not None else {}
    mark = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        laps[step] = round((now - mark) * 1000, 3)
        mark = now

    disk = find_disk(mount, system)
    if mount.read_only and _read(f"{system.sys_block}/{disk}/ro") != "1":
        raise OSError(errno.EROFS, f"{disk} is not a read-only disk")
    lap("find")
    _make_mount_point(mount.path)
    lap("mkdir")
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if mount.read_only else 0)
    options = "noload" if mount.read_only else "noinit_itable"
    system.mount(f"{system.dev_dir}/{disk}", mount.path, "ext4", flags, options)
    lap("mount")
    return disk


def describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno is not None:
        return f"{errno.errorcode.get(err.errno, str(err.errno))}: {err.strerror or err}"
    return f"{type(err).__name__}: {err}"


def mount_volumes(mounts: tuple[VolumeMount, ...], system: VolumeSystem) -> list[dict[str, Any]]:
    """Mount each volume; one result per volume, in order (``ok`` false with the ``error`` when it failed)."""
    results: list[dict[str, Any]] = []
    for mount in mounts:
        started = time.perf_counter()
        steps: dict[str, float] = {}
        result: dict[str, Any] = {"path": mount.path, "serial": mount.serial, "steps_ms": steps}
        try:
            result["device"] = mount_one(mount, system, steps)
            result["ok"] = True
        except Exception as err:
            result.update(ok=False, error=describe(err))
        result["ms"] = round((time.perf_counter() - started) * 1000, 3)
        results.append(result)
    return results


class VolumeSettler:
    """The ``volumes_settle`` op."""

    def __init__(self, system: VolumeSystem | None = None) -> None:
        self.system = system or VolumeSystem()

    def __call__(self, args: dict[str, Any], emit: Callable[[str, bytes], None]) -> dict[str, Any]:
        paths, mode = args.get("paths"), args.get("mode", "freeze")
        if not isinstance(paths, list) or len(paths) > MAX_VOLUMES:
            raise invalid(f"'paths' must be a list of at most {MAX_VOLUMES} paths")
        if mode not in SETTLE_MODES:
            raise invalid(f"'mode' must be one of {', '.join(SETTLE_MODES)}")
        checked = [_check_path(p) for p in paths]
        try:
            self.system.sync()
        except OSError as err:
            raise OpError("internal", f"sync: {err}") from err
        settled: dict[str, str] = {}
        errors: dict[str, str] = {}
        for path in checked:
            try:
                if mode == "freeze":
                    self.system.freeze(path)
                    settled[path] = "frozen"
                else:
                    self.system.umount(path)
                    settled[path] = "unmounted"
            except Exception as err:
                errors[path] = describe(err)
        return {"settled": settled, "errors": errors}
