"""The jail's VM cgroups: v1/v2 detection from a fake ``/proc/self``, and create/remove on plain tmp directories
standing in for the controller mounts (a tmp dir has none of the kernel's files, so what ``create`` writes is
exactly what is there afterwards; VM dirs for ``remove`` are empty, as an rmdir-able cgroup looks to the kernel)."""

from __future__ import annotations

import errno
import logging
import subprocess
from pathlib import Path

import pytest

from cryobox.agent.vm.cgroups import CPU_PERIOD_US, PREFIX, CgroupHost, Limits
from cryobox.errors import VmmError

TAG = "abc123"
OWN = "/process_api/abc"
LIMITS = Limits(memory_bytes=640 << 20, cpus=2.5, pids=256)


def _proc(tmp_path: Path, mountinfo: list[str], cgroup: list[str]) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text("".join(line + "\n" for line in mountinfo))
    (proc / "cgroup").write_text("".join(line + "\n" for line in cgroup))
    return proc


def _v1_mountinfo(mounts: Path) -> list[str]:
    return [
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro",
        "23 22 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
        f"24 22 0:20 / {mounts} ro,nosuid,nodev,noexec shared:3 - tmpfs tmpfs ro,mode=755",
        f"25 24 0:21 / {mounts}/unified rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate",
        f"26 24 0:22 / {mounts}/memory rw,nosuid,nodev,noexec,relatime shared:5 - cgroup cgroup rw,memory",
        f"27 24 0:23 / {mounts}/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:6 - cgroup cgroup rw,cpu,cpuacct",
        f"28 24 0:24 / {mounts}/pids rw,nosuid,nodev,noexec,relatime shared:7 - cgroup cgroup rw,pids",
        f"29 24 0:25 / {mounts}/devices rw,nosuid,nodev,noexec,relatime shared:8 - cgroup cgroup rw,devices",
    ]


V1_CGROUP = [
    "12:pids:/process_api/abc",
    "11:devices:/process_api/abc",
    "10:memory:/process_api/abc",
    "9:cpu,cpuacct:/process_api/abc",
    "0::/process_api/abc",
]


def test_detect_v1_when_the_cgroup2_mount_lacks_memory(tmp_path: Path) -> None:
    mounts = tmp_path / "sys-fs-cgroup"
    (mounts / "unified").mkdir(parents=True)
    (mounts / "unified" / "cgroup.controllers").write_text("cpu pids\n")  # hybrid: memory is on v1
    proc = _proc(tmp_path, _v1_mountinfo(mounts), V1_CGROUP)

    host = CgroupHost.detect(TAG, proc=proc)

    assert host is not None
    assert host.version == 1
    assert host.bases == (
        mounts / "memory" / "process_api" / "abc" / f"{PREFIX}{TAG}",
        mounts / "cpu,cpuacct" / "process_api" / "abc" / f"{PREFIX}{TAG}",
        mounts / "pids" / "process_api" / "abc" / f"{PREFIX}{TAG}",
    )
    # nested under the process's own memory cgroup
    assert host.bases[0].is_relative_to(mounts / "memory" / OWN.lstrip("/"))
    assert host.dirs("vm-1") == [base / "vm-1" for base in host.bases]


def test_detect_v1_in_the_root_cgroup(tmp_path: Path) -> None:
    mounts = tmp_path / "cg"
    proc = _proc(tmp_path, _v1_mountinfo(mounts), ["10:memory:/", "9:cpu,cpuacct:/", "12:pids:/", "0::/"])
    host = CgroupHost.detect(TAG, proc=proc)
    assert host is not None and host.version == 1
    assert host.bases[0] == mounts / "memory" / f"{PREFIX}{TAG}"


def test_detect_v2_when_it_has_every_controller(tmp_path: Path) -> None:
    v2 = tmp_path / "sys-fs-cgroup"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    mountinfo = [
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw",
        f"30 22 0:26 / {v2} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate",
    ]
    proc = _proc(tmp_path, mountinfo, ["0::/process_api/abc"])

    host = CgroupHost.detect(TAG, proc=proc)

    assert host == CgroupHost(2, (v2 / "process_api" / f"{PREFIX}{TAG}",))  # beside its own cgroup


def test_detect_v2_exact_controllers_and_root_cgroup(tmp_path: Path) -> None:
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory cpu pids")
    mountinfo = [f"30 22 0:26 / {v2} rw,relatime shared:9 - cgroup2 cgroup2 rw"]
    proc = _proc(tmp_path, mountinfo, ["0::/"])
    assert CgroupHost.detect(TAG, proc=proc) == CgroupHost(2, (v2 / f"{PREFIX}{TAG}",))


def test_detect_v2_prefers_cgroup2_over_v1_mounts(tmp_path: Path) -> None:
    mounts = tmp_path / "cg"
    (mounts / "unified").mkdir(parents=True)
    (mounts / "unified" / "cgroup.controllers").write_text("memory cpu pids\n")
    proc = _proc(tmp_path, _v1_mountinfo(mounts), V1_CGROUP)
    host = CgroupHost.detect(TAG, proc=proc)
    assert host is not None and host.version == 2
    assert host.bases == (mounts / "unified" / "process_api" / f"{PREFIX}{TAG}",)


def test_detect_none_without_cgroup_mounts(tmp_path: Path) -> None:
    mountinfo = [
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw",
        "23 22 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
    ]
    proc = _proc(tmp_path, mountinfo, ["0::/"])
    assert CgroupHost.detect(TAG, proc=proc) is None


def test_detect_none_when_a_v1_controller_is_missing(tmp_path: Path) -> None:
    mounts = tmp_path / "cg"
    without_pids = [line for line in _v1_mountinfo(mounts) if not line.endswith("rw,pids")]
    proc = _proc(tmp_path, without_pids, V1_CGROUP)  # cgroup2 mount has no cgroup.controllers at all
    assert CgroupHost.detect(TAG, proc=proc) is None


def _v1_host(tmp_path: Path) -> CgroupHost:
    return CgroupHost(1, tuple(tmp_path / c / "agent" / f"{PREFIX}{TAG}" for c in ("memory", "cpu", "pids")))


def _v2_host(tmp_path: Path) -> CgroupHost:
    return CgroupHost(2, (tmp_path / "unified" / "agent-parent" / f"{PREFIX}{TAG}",))


def test_create_v1_writes_every_limit(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    memory, cpu, pids = host.dirs("vm-1")

    procs = host.create("vm-1", LIMITS)

    assert procs == [memory / "cgroup.procs", cpu / "cgroup.procs", pids / "cgroup.procs"]
    assert (memory / "memory.limit_in_bytes").read_text() == str(640 << 20)
    assert (cpu / "cpu.cfs_period_us").read_text() == str(CPU_PERIOD_US) == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "250000"  # 2.5 cores x 100000 us
    assert (pids / "pids.max").read_text() == "256"
    assert sorted(p.name for p in memory.iterdir()) == ["memory.limit_in_bytes"]
    assert sorted(p.name for p in cpu.iterdir()) == ["cpu.cfs_period_us", "cpu.cfs_quota_us"]
    assert sorted(p.name for p in pids.iterdir()) == ["pids.max"]


def test_create_v1_whole_cores(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    host.create("vm-2", Limits(memory_bytes=1 << 30, cpus=1.0, pids=64))
    memory, cpu, pids = host.dirs("vm-2")
    assert (cpu / "cpu.cfs_quota_us").read_text() == "100000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert (pids / "pids.max").read_text() == "64"


def test_create_v2_enables_controllers_at_both_levels(tmp_path: Path) -> None:
    host = _v2_host(tmp_path)
    base = host.bases[0]

    procs = host.create("vm-1", LIMITS)

    vm = base / "vm-1"
    assert procs == [vm / "cgroup.procs"]
    assert (base.parent / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (base / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (vm / "memory.max").read_text() == str(640 << 20)
    assert (vm / "cpu.max").read_text() == "250000 100000"
    assert (vm / "pids.max").read_text() == "256"
    assert not (vm / "cgroup.subtree_control").exists()  # a leaf holding processes enables nothing


def test_create_failure_is_a_vmm_error_naming_the_file(tmp_path: Path) -> None:
    host = _v2_host(tmp_path)
    blocker = host.bases[0].parent / "cgroup.subtree_control"
    blocker.mkdir(parents=True)  # writing it fails as the kernel's refusal would
    with pytest.raises(VmmError, match="vm-1") as raised:
        host.create("vm-1", LIMITS)
    assert "cgroup.subtree_control" in str(raised.value)
    assert not (host.bases[0] / "vm-1").exists()


def _empty_vm_dirs(host: CgroupHost, *vm_ids: str) -> None:
    for vm_id in vm_ids:
        for path in host.dirs(vm_id):
            path.mkdir(parents=True)


@pytest.mark.parametrize("version", [1, 2])
def test_remove_is_idempotent(tmp_path: Path, version: int) -> None:
    host = _v1_host(tmp_path) if version == 1 else _v2_host(tmp_path)
    _empty_vm_dirs(host, "vm-1", "vm-2")

    assert host.remove("vm-1") is True
    assert not any(p.exists() for p in host.dirs("vm-1"))
    assert all(p.is_dir() for p in host.dirs("vm-2"))
    assert host.remove("vm-1") is True  # already gone
    assert host.remove("never-made") is True
    assert CgroupHost(version, (tmp_path / "missing" / "base",) * (3 if version == 1 else 1)).remove("x") is True


def test_remove_reports_a_busy_cgroup_and_still_removes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _v1_host(tmp_path)
    _empty_vm_dirs(host, "vm-1")
    memory, cpu, pids = host.dirs("vm-1")
    real_rmdir = Path.rmdir

    def rmdir(self: Path) -> None:
        if self == cpu:
            raise OSError(errno.EBUSY, "Device or resource busy", str(self))
        real_rmdir(self)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    assert host.remove("vm-1") is False
    assert cpu.is_dir() and not memory.exists() and not pids.exists()


def test_remove_raises_other_errors(tmp_path: Path) -> None:
    host = _v2_host(tmp_path)
    _empty_vm_dirs(host, "vm-1")
    (host.dirs("vm-1")[0] / "child").mkdir()  # a cgroup with a child cgroup: ENOTEMPTY
    with pytest.raises(OSError) as raised:
        host.remove("vm-1")
    assert raised.value.errno == errno.ENOTEMPTY


def test_vm_ids_are_the_dirs_under_every_base(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    assert host.vm_ids() == set()  # no base yet
    _empty_vm_dirs(host, "vm-1", "vm-2")
    (host.bases[2] / "vm-3").mkdir()  # only under pids
    (host.bases[0] / "memory.limit_in_bytes").write_text("1")  # a control file is no VM
    assert host.vm_ids() == {"vm-1", "vm-2", "vm-3"}


def test_reclaim_removes_only_what_is_not_kept(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    _empty_vm_dirs(host, "vm-1", "vm-2", "vm-3")

    assert host.reclaim(keep={"vm-2"}) == 2

    assert host.vm_ids() == {"vm-2"}
    assert all(p.is_dir() for p in host.dirs("vm-2"))
    assert host.reclaim(keep={"vm-2"}) == 0
    assert host.reclaim() == 1
    assert host.vm_ids() == set()


def test_reclaim_does_not_count_a_busy_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    host = _v2_host(tmp_path)
    _empty_vm_dirs(host, "vm-1", "vm-busy")
    busy = host.dirs("vm-busy")[0]
    real_rmdir = Path.rmdir

    def rmdir(self: Path) -> None:
        if self == busy:
            raise OSError(errno.EBUSY, "Device or resource busy", str(self))
        real_rmdir(self)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    with caplog.at_level(logging.WARNING, logger="cryobox.agent.vm.cgroups"):
        assert host.reclaim(wait_s=0.0) == 1
    assert host.vm_ids() == {"vm-busy"}
    assert "vm-busy" in caplog.text


def test_reclaim_kills_a_qemu_no_record_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A QEMU whose pid the agent never learned (its launch was cancelled after the launcher forked it) still sits
    in its VM's cgroup: a reclaim that does not keep that VM kills it, then removes the cgroup."""
    host = _v2_host(tmp_path)
    _empty_vm_dirs(host, "vm-lost", "vm-kept")
    stray = subprocess.Popen(["sleep", "60"])
    lost, kept = host.dirs("vm-lost")[0], host.dirs("vm-kept")[0]
    (lost / "cgroup.procs").write_text(f"{stray.pid}\n")
    real_rmdir = Path.rmdir

    def rmdir(self: Path) -> None:  # cgroupfs: EBUSY while a member lives (here: until it is reaped)
        if self == lost:
            if stray.poll() is None:
                raise OSError(errno.EBUSY, "Device or resource busy", str(self))
            (self / "cgroup.procs").unlink(missing_ok=True)
        real_rmdir(self)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    try:
        assert host.members("vm-lost") == {stray.pid}
        assert host.reclaim(keep={"vm-kept"}) == 1
        assert stray.wait(timeout=5) == -9  # killed, not left running
        assert host.vm_ids() == {"vm-kept"} and kept.is_dir()
    finally:
        stray.kill()
        stray.wait()


def test_remove_base_keeps_a_base_in_use(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    _empty_vm_dirs(host, "vm-1")
    host.remove("vm-1")
    (host.bases[1] / "vm-2").mkdir()  # cpu still has a VM

    host.remove_base()

    assert not host.bases[0].exists() and not host.bases[2].exists()
    assert host.bases[1].is_dir()
    host.remove_base()  # missing and busy bases are both fine
    assert host.bases[1].is_dir()


def test_memory_peak_v1(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    _empty_vm_dirs(host, "vm-1")
    memory = host.dirs("vm-1")[0]
    assert host.memory_peak("vm-1") is None
    (memory / "memory.peak").write_text("1\n")  # the v2 name means nothing on v1
    assert host.memory_peak("vm-1") is None
    (memory / "memory.max_usage_in_bytes").write_text("123456789\n")
    assert host.memory_peak("vm-1") == 123456789
    assert host.memory_peak("gone") is None


def test_memory_peak_v2(tmp_path: Path) -> None:
    host = _v2_host(tmp_path)
    _empty_vm_dirs(host, "vm-1")
    vm = host.dirs("vm-1")[0]
    (vm / "memory.max_usage_in_bytes").write_text("1\n")  # the v1 name means nothing on v2
    assert host.memory_peak("vm-1") is None
    (vm / "memory.peak").write_text("987654\n")
    assert host.memory_peak("vm-1") == 987654
    (vm / "memory.peak").write_text("max\n")
    assert host.memory_peak("vm-1") is None


@pytest.mark.parametrize(
    ("setting", "weights"),
    [
        ("set_background", ("64", "6")),  # a warming pool QEMU: a sixteenth of the normal weight
        ("set_urgent", ("16384", "1600")),  # the VM a request waits for while it is adopted: sixteen times
    ],
)
def test_a_vm_gets_its_cpu_weight_and_then_the_normal_one(
    tmp_path: Path, setting: str, weights: tuple[str, str]
) -> None:
    v1, v2 = _v1_host(tmp_path), _v2_host(tmp_path)
    v1.create("vm-1", LIMITS)
    v2.create("vm-1", LIMITS)
    shares, weight = v1.dirs("vm-1")[1] / "cpu.shares", v2.dirs("vm-1")[0] / "cpu.weight"
    getattr(v1, setting)("vm-1", True)
    getattr(v2, setting)("vm-1", True)
    assert (shares.read_text(), weight.read_text()) == weights
    getattr(v1, setting)("vm-1", False)
    getattr(v2, setting)("vm-1", False)
    assert (shares.read_text(), weight.read_text()) == ("1024", "100")
    getattr(v1, setting)("vm-gone", True)  # best effort: a cgroup gone is no error
    assert not (tmp_path / "cpu" / "agent" / f"{PREFIX}{TAG}" / "vm-gone").exists()
