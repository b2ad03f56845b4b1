"""A VM's usage read on the host: from its cgroup (v2 and v1 files in a temporary tree), else from its QEMU in
``/proc`` (a fake tree), and CPU percent from two readings."""

from __future__ import annotations

from pathlib import Path

from cryobox.agent.observe.usage import CLOCK_TICKS, HostUsage, VmProbe, cpu_percent, read_usage
from tests.support.procfs import fake_usage


def fake_proc(root: Path, pid: int, utime: int, stime: int, rss_kib: int) -> Path:
    fake_usage(root / "proc", pid, utime=utime, stime=stime, rss_kib=rss_kib)
    return root / "proc"


def test_cgroup_v2_is_read_first(tmp_path: Path) -> None:
    base = tmp_path / "cg" / "vm-1"
    base.mkdir(parents=True)
    (base / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (base / "memory.current").write_text("123456789\n")
    proc = fake_proc(tmp_path, 42, 999, 999, 1)
    usage = read_usage(VmProbe(42, 2, (base,)), proc)
    assert usage == HostUsage(cpu_ns=2_500_000_000, memory_bytes=123456789, source="cgroup")


def test_cgroup_v1_needs_cpuacct_else_the_process_answers(tmp_path: Path) -> None:
    memory, cpu, pids = (tmp_path / c / "vm-1" for c in ("memory", "cpu", "pids"))
    for path in (memory, cpu, pids):
        path.mkdir(parents=True)
    (memory / "memory.usage_in_bytes").write_text("4096\n")
    proc = fake_proc(tmp_path, 7, utime=150, stime=50, rss_kib=2048)
    probe = VmProbe(7, 1, (memory, cpu, pids))
    from_proc = read_usage(probe, proc)  # cpuacct not mounted with cpu (this host's layout)
    assert from_proc == HostUsage(cpu_ns=200 * 1_000_000_000 // CLOCK_TICKS, memory_bytes=2048 * 1024, source="proc")
    (cpu / "cpuacct.usage").write_text("900000000\n")
    assert read_usage(probe, proc) == HostUsage(900_000_000, 4096, "cgroup")


def test_no_cgroup_and_no_process_is_none(tmp_path: Path) -> None:
    assert read_usage(VmProbe(None), tmp_path) is None
    assert read_usage(VmProbe(12345), tmp_path / "proc") is None


def test_cpu_percent_per_vcpu_capped_and_safe() -> None:
    before = HostUsage(1_000_000_000, 0, "cgroup")
    after = HostUsage(2_000_000_000, 0, "cgroup")
    assert cpu_percent(before, after, 2.0, 1) == 50.0
    assert cpu_percent(before, after, 2.0, 2) == 25.0
    assert cpu_percent(before, HostUsage(9_000_000_000, 0, "cgroup"), 1.0, 2) == 100.0  # QEMU's own threads
    assert cpu_percent(after, before, 1.0, 1) == 0.0  # a counter never runs backwards
    assert cpu_percent(before, HostUsage(2_000_000_000, 0, "proc"), 1.0, 1) == 0.0  # not comparable
    assert cpu_percent(before, after, 0.0, 1) == 0.0
