"""What a VM costs its host, read on the host: CPU time and memory charged, from the VM's cgroup (the jail's,
:mod:`..vm.cgroups`) or, without one, from its QEMU process in ``/proc``. A guest cannot fake these, and reading
them costs the guest nothing.

- cgroup v2: ``cpu.stat`` ``usage_usec``, ``memory.current``;
- cgroup v1: ``cpuacct.usage`` (when ``cpuacct`` is mounted with ``cpu``), ``memory.usage_in_bytes``;
- ``/proc/<pid>/stat`` ``utime + stime`` (every thread of QEMU), ``/proc/<pid>/status`` ``VmRSS``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...util.procfs import PROC
from ..vm import MicroVM

NS = 1_000_000_000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_UTIME_FIELD = 14  # fields of /proc/<pid>/stat, counting from 1 (man 5 proc); stime is the next


@dataclass(frozen=True)
class VmProbe:
    """Where one VM's usage is read: its cgroup's directories (v2: one; v1: memory, cpu, pids) and its pid."""

    pid: int | None
    cgroup_version: int | None = None
    cgroup_dirs: tuple[Path, ...] = ()

    @classmethod
    def of(cls, vm: MicroVM) -> VmProbe:
        cgroups = vm.jail.settings.cgroups if vm.jail is not None else None
        if cgroups is None:
            return cls(vm.pid)
        return cls(vm.pid, cgroups.version, tuple(cgroups.dirs(vm.vm_id)))


@dataclass(frozen=True)
class HostUsage:
    cpu_ns: int
    """CPU time the VM has used so far (a counter: samples take differences)."""
    memory_bytes: int
    source: str
    """``cgroup`` or ``proc``: where the figures were read (a VM's source never changes while it runs)."""


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _keyed(path: Path, key: str) -> int | None:
    """The value of ``key`` in a ``key value`` file (``cpu.stat``), or of ``key:`` in ``/proc/<pid>/status``."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].rstrip(":") == key:
            try:
                return int(fields[1])
            except ValueError:
                return None
    return None


def _from_cgroup(probe: VmProbe) -> HostUsage | None:
    if probe.cgroup_version == 2 and probe.cgroup_dirs:
        base = probe.cgroup_dirs[0]
        usec, memory = _keyed(base / "cpu.stat", "usage_usec"), _read_int(base / "memory.current")
        if usec is not None and memory is not None:
            return HostUsage(usec * 1000, memory, "cgroup")
    elif probe.cgroup_version == 1 and len(probe.cgroup_dirs) >= 2:
        memory_dir, cpu_dir = probe.cgroup_dirs[0], probe.cgroup_dirs[1]
        cpu_ns, memory = _read_int(cpu_dir / "cpuacct.usage"), _read_int(memory_dir / "memory.usage_in_bytes")
        if cpu_ns is not None and memory is not None:
            return HostUsage(cpu_ns, memory, "cgroup")
    return None


def _from_proc(pid: int, proc: Path) -> HostUsage | None:
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 1 :].split()  # comm may hold spaces: split after its closing parenthesis
    try:
        ticks = int(fields[_UTIME_FIELD - 3]) + int(fields[_UTIME_FIELD - 2])
    except (IndexError, ValueError):
        return None
    rss_kib = _keyed(proc / str(pid) / "status", "VmRSS")
    return HostUsage(ticks * NS // CLOCK_TICKS, (rss_kib or 0) * 1024, "proc")


def read_usage(probe: VmProbe, proc: Path = PROC) -> HostUsage | None:
    """The VM's usage now (its cgroup's if it has one with the figures, else its QEMU's); ``None`` when neither
    can be read (QEMU gone)."""
    found = _from_cgroup(probe)
    if found is None and probe.pid is not None:
        found = _from_proc(probe.pid, proc)
    return found


def cpu_percent(before: HostUsage, after: HostUsage, elapsed_s: float, cpus: int) -> float:
    """CPU used between two readings, per vCPU, 0-100 (QEMU's own threads can exceed the vCPUs: capped)."""
    if elapsed_s <= 0 or cpus <= 0 or after.source != before.source:
        return 0.0
    used = max(0, after.cpu_ns - before.cpu_ns) / NS
    return round(min(100.0, 100.0 * used / (elapsed_s * cpus)), 2)
