"""A reflink-capable data volume: files the agent must copy inside a VM pause window live on it.

Cloning a file with the ``FICLONE`` ioctl shares its extents copy-on-write, so a qcow2 overlay or snapshot file is
"copied" at a cost that does not grow with its size. XFS (``-m reflink=1``), btrfs and bcachefs can; ext4 cannot. The
volume root is always ``<data_dir>/vol``::

    data dir supports reflink   vol/ is a plain directory
    otherwise                   volume.xfs   sparse XFS image (reflink=1), created once and never deleted
                                vol/         volume.xfs loop-mounted here (the loop device detaches on umount)
                                .volume.lock flock held while mounting/unmounting

A mount left by a crashed agent is reused. Where cloning is impossible, :func:`clone_file` falls back to
:func:`copy_sparse`, which copies only the data extents so holes stay holes.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypeVar

from ...errors import VmmError
from ...util.files import data_extents

FICLONE = 0x40049409  # _IOW(0x94, 9, int)
log = logging.getLogger(__name__)

VOLUME_DIR = "vol"
IMAGE_NAME = "volume.xfs"
LOCK_NAME = ".volume.lock"
UMOUNT_ATTEMPTS = 5
UMOUNT_RETRY_DELAY_S = 0.2

_CHUNK = 1 << 20
_ZERO_CHUNK = bytes(_CHUNK)
# errnos meaning "this pair of files cannot be cloned / copied in-kernel here", not "something is broken"
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS})
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

_T = TypeVar("_T")

Runner: TypeAlias = Callable[[list[str]], None]
"""Runs ``argv`` to completion; raises :class:`VmmError` (naming the command and its output) on failure."""


def subprocess_runner(argv: list[str]) -> None:
    """The real :data:`Runner`: ``subprocess.run`` with captured output."""
    try:
        subprocess.run(argv, capture_output=True, text=True, check=True)
    except FileNotFoundError as exc:
        message = f"{argv[0]} not found (install xfsprogs and util-linux) running: {' '.join(argv)}"
        raise VmmError(message, details={"argv": argv}) from exc
    except subprocess.CalledProcessError as exc:
        output = f"{exc.stdout or ''}{exc.stderr or ''}".strip() or "(no output)"
        message = f"{' '.join(argv)} failed with exit code {exc.returncode}: {output}"
        raise VmmError(message, details={"argv": argv, "exit_code": exc.returncode, "output": output}) from exc


def supports_reflink(directory: Path) -> bool:
    """Whether files in ``directory`` can be cloned with ``FICLONE`` (probed with two unnamed temporary files)."""
    with tempfile.TemporaryFile(dir=directory) as src, tempfile.TemporaryFile(dir=directory) as dst:
        try:
            os.pwrite(src.fileno(), b"\xa5" * 4096, 0)
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError:
            return False
    return True


def clone_file(src: Path, dst: Path) -> str:
    """Make ``dst`` a copy of ``src``'s content; return ``"reflink"`` or ``"copy"`` (the method used).

    Clones with ``FICLONE`` where the filesystem allows it, else copies sparsely. ``dst`` appears atomically
    (written under a temporary name in its directory, then renamed). Mode, owner and times are not preserved,
    and nothing is fsynced.
    """
    with open(src, "rb") as fh:
        src_fd = fh.fileno()

        def fill(dst_fd: int) -> str:
            try:
                fcntl.ioctl(dst_fd, FICLONE, src_fd)
                return "reflink"
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
            _copy_data(src_fd, dst_fd, os.fstat(src_fd).st_size)
            return "copy"

        return _write_via_temp(dst, fill)


def copy_sparse(src: Path, dst: Path) -> int:
    """Copy ``src`` to ``dst`` writing only its data; return the number of data bytes written.

    Data extents are found with ``SEEK_DATA``/``SEEK_HOLE`` and copied with ``copy_file_range`` (or
    ``pread``/``pwrite`` across filesystems, skipping all-zero chunks). ``dst`` is sized like ``src`` so holes
    stay holes, and appears atomically (temporary name, then rename). Nothing is fsynced.
    """
    with open(src, "rb") as fh:
        src_fd = fh.fileno()
        return _write_via_temp(dst, lambda dst_fd: _copy_data(src_fd, dst_fd, os.fstat(src_fd).st_size))


def allocated_bytes(path: Path) -> int:
    """Bytes allocated for a file, or for all files below a directory (symlinks not followed); 0 if missing."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with suppress(FileNotFoundError):
                entry = os.lstat(os.path.join(dirpath, name))
                total += entry.st_blocks * 512 if stat.S_ISREG(entry.st_mode) else 0
    return total


@dataclass(frozen=True)
class Volume:
    root: Path
    image: Path | None  # None when the data dir itself supports reflink
    reflink: bool


def ensure_volume(data_dir: Path, size_gib: int = 64, runner: Runner = subprocess_runner) -> Volume:
    """Return the reflink-capable volume under ``data_dir``, creating and mounting its XFS image if needed.

    Reuses an existing mount (e.g. left by a crashed agent). Raises :class:`VmmError` if ``mkfs.xfs`` or
    ``mount`` are missing or fail, or if the mounted volume still cannot clone files.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    root = data_dir / VOLUME_DIR
    if supports_reflink(data_dir):
        root.mkdir(exist_ok=True)
        return Volume(root, None, True)
    image = data_dir / IMAGE_NAME
    with _volume_lock(data_dir):
        found = _mounted(root)
        if found is None:
            if not image.exists():
                _make_image(image, size_gib, runner)
            root.mkdir(exist_ok=True)
            if any(root.iterdir()):
                raise VmmError(f"refusing to mount {image} over {root}: the directory is not empty")
            runner(["mount", "-o", "loop", str(image), str(root)])
            _direct_io(root, runner)
        # an XFS mount already in place (an earlier agent's) was probed when it was made: a restart's probe, a
        # transaction on the loop device, took up to 0.25 s of its start under load
        if (found is None or found[0] != "xfs") and not supports_reflink(root):
            runner(["umount", str(root)])
            raise VmmError(f"{root} (mounted from {image}) does not support reflink; was it made with -m reflink=1?")
    return Volume(root, image, True)


def _direct_io(root: Path, runner: Runner) -> None:
    """Switch the loop device under ``root`` to direct I/O on its image file (``losetup --direct-io=on``).

    Buffered, every block the volume writes is cached twice (the XFS file's page and the image file's) and a
    write to a region of the sparse image not written before costs a page-cache page and an ext4 allocation:
    a 256 MiB O_DIRECT write into a new snapshot layer took 35–712 ms buffered, 81–91 ms with direct I/O, and
    its fsync ~100 ms against ~1 ms (measured here). Where the image's file system cannot (no O_DIRECT), the
    volume stays buffered."""
    device = _mount_source(root)
    if device is None or not device.startswith("/dev/loop"):
        return
    try:
        runner(["losetup", "--direct-io=on", device])
    except VmmError as err:
        log.warning("volume %s stays on buffered I/O: %s", root, err.message)


def _mount_source(root: Path) -> str | None:
    """The source (field after the separator) of ``root``'s line of ``/proc/self/mountinfo``."""
    found = _mounted(root)
    return found[1] if found is not None else None


def _mounted(root: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> tuple[str, str | None] | None:
    """The file system type and source of the mount over ``root`` (the last one listed: the one seen there), or
    ``None`` when nothing is mounted there."""
    target = os.path.realpath(root)
    found = None
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            fields = line.rstrip("\n").split(" ")
            if len(fields) > 4 and _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4]) == target:
                rest = fields[fields.index("-") + 1 :] if "-" in fields else []
                found = (rest[0] if rest else "", rest[1] if len(rest) > 1 else None)
    return found


def release_volume(data_dir: Path, runner: Runner = subprocess_runner) -> bool:
    """Unmount ``<data_dir>/vol`` if it is mounted; return whether this call unmounted it. Never deletes the image.

    A busy mount is retried a few times, then detached lazily (``umount -l``).
    """
    root = data_dir / VOLUME_DIR
    if not is_mount_point(root):
        return False
    with _volume_lock(data_dir):
        if not is_mount_point(root):  # a racing caller got there first
            return False
        for _ in range(UMOUNT_ATTEMPTS):
            try:
                runner(["umount", str(root)])
                return True
            except VmmError:  # typically EBUSY: a process still has a file open on the volume
                time.sleep(UMOUNT_RETRY_DELAY_S)
                if not is_mount_point(root):
                    return True
        runner(["umount", "-l", str(root)])
        return True


def is_mount_point(path: Path) -> bool:
    """Whether ``path`` (symlinks resolved) is a mount point of this process's mount namespace."""
    return _mounted(path) is not None


@contextmanager
def _volume_lock(data_dir: Path) -> Iterator[None]:
    with open(data_dir / LOCK_NAME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _make_image(image: Path, size_gib: int, runner: Runner) -> None:
    tmp = image.with_name(f".{image.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.truncate(size_gib << 30)
        runner(["mkfs.xfs", "-q", "-m", "reflink=1", str(tmp)])
        os.replace(tmp, image)
    finally:
        tmp.unlink(missing_ok=True)


def _write_via_temp(dst: Path, fill: Callable[[int], _T]) -> _T:
    """Run ``fill(fd)`` on a new temporary file (mode 0600) next to ``dst``, then rename it to ``dst``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        try:
            result = fill(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return result


def _copy_data(src_fd: int, dst_fd: int, size: int) -> int:
    """Copy the first ``size`` bytes of ``src_fd`` to ``dst_fd`` (made exactly ``size`` long) extent by extent."""
    os.ftruncate(dst_fd, size)
    in_kernel = True
    copied = 0
    for start, end in data_extents(src_fd, size):
        pos = start
        while pos < end:
            if in_kernel:
                try:
                    n = os.copy_file_range(src_fd, dst_fd, end - pos, pos, pos)
                except OSError as exc:
                    if exc.errno not in _UNSUPPORTED:
                        raise
                    in_kernel = False  # e.g. EXDEV between filesystems: fall back for the rest of the file
                    continue
            else:
                n = _copy_chunk(src_fd, dst_fd, pos, min(_CHUNK, end - pos))
            if n == 0:  # the source shrank under us
                break
            pos += n
        copied += pos - start
    return copied


def _copy_chunk(src_fd: int, dst_fd: int, offset: int, length: int) -> int:
    data = os.pread(src_fd, length, offset)
    if data != _ZERO_CHUNK[: len(data)]:  # an all-zero chunk stays a hole in the (pre-sized) destination
        view = memoryview(data)
        while view:
            written = os.pwrite(dst_fd, view, offset)
            view, offset = view[written:], offset + written
    return len(data)
