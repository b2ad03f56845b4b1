"""Mounts the build driver makes (with the build VM's ``mount(8)``), and their cleanup.

For a ``RUN`` the target gets ``/proc``, ``/sys``, ``/dev`` (a bind of the VM's, made private at once so the
``/dev/pts`` and ``/dev/shm`` mounted on it never propagate back), ``/dev/pts``, ``/dev/shm`` and tmpfs mounts
(``/run`` by default), all unmounted afterwards, on failure too: :func:`unmount_under` takes down whatever is
mounted below the target, deepest first, so a step killed half way is cleaned up by the next command. Processes a
``RUN`` left behind (anything whose root is the target) are killed first, or the unmounts would find them busy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence

from .errors import BuildError
from .paths import inside, resolve_in_root

Runner = Callable[[list[str]], None]
Log = Callable[[str], None]
MOUNTINFO = "/proc/self/mountinfo"
KILL_WAIT_S = 5.0
RUN_TMPFS = ("/run",)
"""tmpfs mounts of a ``RUN`` by default. Not ``/tmp``: Docker keeps the image's ``/tmp`` during ``RUN``, and
``COPY x /tmp/`` then ``RUN /tmp/x`` is common; a step's json may ask for others (``"tmpfs": ["/run", "/tmp"]``)."""


def run_command(argv: list[str]) -> None:
    """Run a mount tool; :raises BuildError: it failed (with its own message)."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise BuildError(f"{' '.join(argv)} failed: {message[-1] if message else f'status {done.returncode}'}")


def _unescape(field: str) -> str:
    """A mountinfo path (spaces and friends are written as octal escapes)."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def mount_points(mountinfo: str = MOUNTINFO) -> list[str]:
    """Every mount point, in mount order (a stacked mount point appears once per mount)."""
    with open(mountinfo) as handle:
        return [_unescape(line.split()[4]) for line in handle if line.strip()]


def is_mount_point(path: str, mountinfo: str = MOUNTINFO) -> bool:
    return os.path.abspath(path) in mount_points(mountinfo)


def mounts_under(path: str, include_self: bool = False, mountinfo: str = MOUNTINFO) -> list[str]:
    """Mount points strictly below ``path`` (and ``path`` itself with ``include_self``), last mounted first."""
    base = os.path.abspath(path)
    found = [p for p in mount_points(mountinfo) if p.startswith(base + "/") or include_self and p == base]
    return list(reversed(found))


def unmount_under(path: str, runner: Runner = run_command, include_self: bool = False) -> None:
    """Unmount everything mounted below ``path`` (lazily when busy). :raises BuildError: a mount stays."""
    for _ in range(64):
        points = mounts_under(path, include_self)
        if not points:
            return
        for point in points:
            try:
                runner(["umount", point])
            except BuildError:
                runner(["umount", "-l", point])
    raise BuildError(f"mounts under {path} would not go away: {', '.join(mounts_under(path, include_self))}")


def chrooted_pids(root: str, proc: str = "/proc") -> list[int]:
    """Processes whose root directory is ``root`` (a ``RUN``'s leftovers)."""
    want = os.path.realpath(root)
    found = []
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(os.path.join(proc, name, "root")) == want:
                found.append(int(name))
    return found


def kill_chrooted(root: str, log: Log) -> None:
    """SIGKILL every process left running in ``root`` and wait (a while) for them to go."""
    deadline = time.monotonic() + KILL_WAIT_S
    announced = False
    while pids := chrooted_pids(root):
        if not announced:
            log(f"killing {len(pids)} processes the step left running")
            announced = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise BuildError(f"processes {pids} left by the step would not die")
        time.sleep(0.02)


def mount_point(root: str, path: str, mode: int = 0o755) -> str:
    """The host path of directory ``path`` in the target, created if missing.

    :raises BuildError: it is a symbolic link or not a directory (``mount(8)`` would follow the link out of it).
    """
    host = resolve_in_root(root, path)
    try:
        existing = os.lstat(host).st_mode
    except FileNotFoundError:
        os.makedirs(host, mode)
        return host
    if not stat.S_ISDIR(existing):
        raise BuildError(f"{inside(root, host)} in the image is not a directory: cannot mount there")
    return host


@contextlib.contextmanager
def run_mounts(root: str, log: Log, runner: Runner = run_command, tmpfs: Sequence[str] = RUN_TMPFS) -> Iterator[None]:
    """``/proc``, ``/sys``, ``/dev`` (+ ``/dev/pts``, ``/dev/shm``) and tmpfs mounts in ``root`` for a ``RUN``;
    leftover processes killed and everything under ``root`` unmounted on the way out, whatever happened."""
    try:
        runner(["mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", mount_point(root, "/proc", 0o555)])
        runner(["mount", "-t", "sysfs", "-o", "ro,nosuid,nodev,noexec", "sysfs", mount_point(root, "/sys", 0o555)])
        dev = mount_point(root, "/dev")
        runner(["mount", "--bind", "/dev", dev])
        runner(["mount", "--make-private", dev])
        runner(["mount", "-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=0620", "devpts", f"{dev}/pts"])
        if not os.path.isdir(f"{dev}/shm"):
            os.mkdir(f"{dev}/shm", 0o1777)
        runner(["mount", "-t", "tmpfs", "-o", "nosuid,nodev,mode=1777", "shm", f"{dev}/shm"])
        for path in tmpfs:
            mode = "1777" if path.rstrip("/") in ("/tmp", "/var/tmp") else "755"
            runner(["mount", "-t", "tmpfs", "-o", f"nosuid,nodev,mode={mode}", "tmpfs", mount_point(root, path)])
        yield
    finally:
        kill_chrooted(root, log)
        unmount_under(root, runner)


__all__ = [
    "RUN_TMPFS",
    "chrooted_pids",
    "is_mount_point",
    "kill_chrooted",
    "mount_point",
    "mount_points",
    "mounts_under",
    "run_command",
    "run_mounts",
    "unmount_under",
]
