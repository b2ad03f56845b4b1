"""A cgroup per VM with memory, CPU and pids limits, on cgroup v1 or v2 (detected from ``/proc/self``).

Every VM's cgroup is nested under the agent's own cgroup (v1: per controller; v2: beside it, since a v2 cgroup
holding processes cannot enable controllers for children) in a directory named for the agent's data dir::

    v1  <mount of memory>/<agent's memory cgroup>/cryobox-<tag>/<vm_id>   (and the same under cpu, pids)
    v2  <cgroup2 mount>/<parent of the agent's cgroup>/cryobox-<tag>/<vm_id>

Nesting keeps whatever accounts for the agent (a container, a systemd unit) accounting for its VMs too. The
jail launcher writes its own pid to each ``cgroup.procs`` before it forks QEMU; a VM's cgroup is removed when
its QEMU is gone (an empty cgroup is an ``rmdir``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...errors import VmmError

log = logging.getLogger(__name__)
CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
PREFIX = "cryobox-"
BACKGROUND_SHARES_V1 = 64
BACKGROUND_WEIGHT_V2 = 6
"""A warming pool QEMU's CPU weight: 1/16 of a normal cgroup's (1024 shares on v1, weight 100 on v2)."""
URGENT_SHARES_V1 = 16384
URGENT_WEIGHT_V2 = 1600
"""The weight of a VM a request waits for while a restart adopts it: 16 times a normal one's."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpus: float
    """CPU time per period, in cores (the quota)."""
    pids: int


@dataclass(frozen=True)
class CgroupHost:
    """Where this agent's VM cgroups live: one base directory per controller (v1) or one for all (v2)."""

    version: int
    bases: tuple[Path, ...]

    @classmethod
    def detect(cls, tag: str, proc: Path = Path("/proc/self")) -> CgroupHost | None:
        """``None`` when the host has neither a v2 hierarchy with our controllers nor v1 mounts of them."""
        mounts = _cgroup_mounts(proc / "mountinfo")
        own = _own_cgroups(proc / "cgroup")
        v2 = mounts.get("cgroup2")
        if v2 is not None and set(CONTROLLERS) <= _available(v2):
            here = own.get("", "/")
            parent = here if here == "/" else str(Path(here).parent)
            return cls(2, (v2 / parent.lstrip("/") / f"{PREFIX}{tag}",))
        bases = []
        for controller in CONTROLLERS:
            mount = mounts.get(controller)
            if mount is None:
                return None
            bases.append(mount / own.get(controller, "/").lstrip("/") / f"{PREFIX}{tag}")
        return cls(1, tuple(bases))

    def dirs(self, vm_id: str) -> list[Path]:
        return [base / vm_id for base in self.bases]

    def create(self, vm_id: str, limits: Limits) -> list[Path]:
        """Make ``vm_id``'s cgroup(s) with ``limits``; returns the ``cgroup.procs`` files to join.

        :raises VmmError: the cgroup filesystem refused (the message names the file).
        """
        try:
            if self.version == 2:
                return [self._create_v2(vm_id, limits)]
            return self._create_v1(vm_id, limits)
        except OSError as err:
            self.remove(vm_id)
            raise VmmError(f"cannot create the cgroup of VM {vm_id}: {err}") from err

    def _create_v1(self, vm_id: str, limits: Limits) -> list[Path]:
        memory, cpu, pids = self.dirs(vm_id)
        for path in (memory, cpu, pids):
            path.mkdir(parents=True, exist_ok=True)
        _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", int(limits.cpus * CPU_PERIOD_US))
        _write(pids / "pids.max", limits.pids)
        return [p / "cgroup.procs" for p in (memory, cpu, pids)]

    def _create_v2(self, vm_id: str, limits: Limits) -> Path:
        base = self.bases[0]
        enable = " ".join(f"+{c}" for c in CONTROLLERS)
        for level in (base.parent, base):
            level.mkdir(parents=True, exist_ok=True)
            _write(level / "cgroup.subtree_control", enable)
        path = base / vm_id
        path.mkdir(exist_ok=True)
        _write(path / "memory.max", limits.memory_bytes)
        _write(path / "memory.swap.max", 0, optional=True)
        _write(path / "cpu.max", f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        _write(path / "pids.max", limits.pids)
        return path / "cgroup.procs"

    def remove(self, vm_id: str) -> bool:
        """Remove ``vm_id``'s cgroup(s) if their processes are gone; ``False`` if one still holds a process."""
        gone = True
        for path in self.dirs(vm_id):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                if err.errno != errno.EBUSY:
                    raise
                gone = False
        return gone

    def set_background(self, vm_id: str, background: bool) -> None:
        """Give ``vm_id``'s cgroup a small CPU weight (``background``) or the normal one: a pool QEMU warming up
        yields the cores to the sandboxes and creates that run meanwhile, and gets its share back when a create
        takes it. Best effort (a cgroup gone, a controller without weights: nothing changes)."""
        self._weigh(vm_id, (BACKGROUND_WEIGHT_V2, BACKGROUND_SHARES_V1) if background else (100, 1024))

    def set_urgent(self, vm_id: str, urgent: bool) -> None:
        """Give ``vm_id``'s cgroup 16 times the normal CPU weight (``urgent``) or the normal one: under TCG a
        restart's 50 idle guests kept the cores busy, and the QMP and guest answers of the VM a request waited for
        took 0.1-0.3 s each to be scheduled. Best effort, as :meth:`set_background`."""
        self._weigh(vm_id, (URGENT_WEIGHT_V2, URGENT_SHARES_V1) if urgent else (100, 1024))

    def _weigh(self, vm_id: str, weights: tuple[int, int]) -> None:
        if self.version == 2:
            path, value = self.bases[0] / vm_id / "cpu.weight", weights[0]
        else:
            path, value = self.bases[1] / vm_id / "cpu.shares", weights[1]
        try:
            path.write_text(str(value))
        except OSError as err:
            log.debug("cannot set the CPU weight of %s: %s", vm_id, err)

    def vm_ids(self) -> set[str]:
        found: set[str] = set()
        for base in self.bases:
            with contextlib.suppress(FileNotFoundError):
                found.update(entry.name for entry in os.scandir(base) if entry.is_dir())
        return found

    def members(self, vm_id: str) -> set[int]:
        """The pids in ``vm_id``'s cgroup(s), as this host sees them."""
        pids: set[int] = set()
        for path in self.dirs(vm_id):
            with contextlib.suppress(FileNotFoundError, ValueError):
                pids.update(int(line) for line in (path / "cgroup.procs").read_text().split())
        return pids

    def kill(self, vm_id: str) -> int:
        """SIGKILL every process in ``vm_id``'s cgroup(s): a QEMU whose pid the agent never learned (a launch
        cancelled after the launcher forked it) or whose records went. Returns how many were signalled."""
        pids = self.members(vm_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def reclaim(
        self,
        keep: set[str] = frozenset(),  # type: ignore[assignment]
        wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int:
        """Remove the cgroups of VMs not in ``keep``; returns how many. A cgroup that still holds a process holds
        a QEMU nothing else knows of (the run-dir reclaim kills the ones it finds): it is killed first, and its
        cgroup removed once init has reaped it (``wait_s``)."""
        removed = 0
        for vm_id in self.vm_ids() - keep:
            if self.remove(vm_id):
                removed += 1
                continue
            killed = self.kill(vm_id)
            log.warning("killed %d stray process(es) in the cgroup of VM %s (a QEMU no record named)", killed, vm_id)
            deadline = clock() + wait_s
            while not (gone := self.remove(vm_id)) and clock() < deadline:
                sleep(0.01)
            if gone:
                removed += 1
            else:
                log.warning("cgroup of VM %s still holds a process; left in place", vm_id)
        return removed

    def remove_base(self) -> None:
        """Remove the (empty) per-agent directories; a cgroup still in use keeps its base."""
        for base in self.bases:
            with contextlib.suppress(FileNotFoundError, OSError):
                base.rmdir()

    def memory_peak(self, vm_id: str) -> int | None:
        """The most memory the VM's cgroup has been charged (bytes), where the kernel reports it."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.dirs(vm_id)[0] / name).read_text())
        except (OSError, ValueError):
            return None


def _write(path: Path, value: object, *, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not optional:
            raise


def _cgroup_mounts(mountinfo: Path) -> dict[str, Path]:
    """Controller name (or ``cgroup2``) -> its mount point, from ``/proc/self/mountinfo``."""
    found: dict[str, Path] = {}
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            found.setdefault("cgroup2", point)
        elif fstype == "cgroup":
            for option in options:
                if option in CONTROLLERS:
                    found.setdefault(option, point)
    return found


def _own_cgroups(cgroup_file: Path) -> dict[str, str]:
    """Controller -> this process's cgroup path (``""`` is the v2 hierarchy)."""
    own: dict[str, str] = {}
    for line in cgroup_file.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _available(mount: Path) -> set[str]:
    try:
        return set((mount / "cgroup.controllers").read_text().split())
    except OSError:
        return set()
