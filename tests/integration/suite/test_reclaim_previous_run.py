"""The suite's own start: an interrupted earlier run's mounts and network objects under the base temp dir are
reclaimed before pytest empties it (a mount point left there once stopped a CI run before its first test)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cryobox.agent.net.slots import tag_for
from tests.support.teardown import CGROUP_ROOT, reclaim_data_dir, reclaim_dead_postgres, reclaim_previous_run


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/self/mounts").read_text().splitlines())


def test_a_previous_runs_mounts_and_tagged_namespaces_are_reclaimed(tmp_path: Path) -> None:
    root = tmp_path / "basetemp"
    data_dir = root / "popen-gw0" / "serve0"
    vol = data_dir / "vol"
    vol.mkdir(parents=True)
    netns = f"cryobox-{tag_for(data_dir)}-0"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(vol)], check=True)
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        assert _mounted(vol)
        gone = reclaim_previous_run(root)
        assert not _mounted(vol)
        assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"mount {vol}" in gone and f"network objects tagged {tag_for(data_dir)}" in gone
        assert reclaim_previous_run(root) == []  # idempotent: nothing left the second time
    finally:
        subprocess.run(["umount", "-l", str(vol)], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)


def test_a_missing_base_temp_dir_is_nothing_to_reclaim(tmp_path: Path) -> None:
    assert reclaim_previous_run(tmp_path / "absent") == []


def test_a_killed_runs_postgres_dirs_go_and_a_live_or_young_ones_stay(tmp_path: Path) -> None:
    def pg_dir(name: str, pid: int | None, age_s: float) -> Path:
        root = tmp_path / name
        (root / "data").mkdir(parents=True)
        if pid is not None:
            (root / "data" / "postmaster.pid").write_text(f"{pid}\n/some/data\n")
        then = root.stat().st_mtime - age_s
        os.utime(root, (then, then))
        return root

    dead = pg_dir("cbxpg-dead", 2**22 + 17, 3600)  # above pid_max's default: no such process
    no_pid = pg_dir("cbxpg-nopid", None, 3600)
    live = pg_dir("cbxpg-live", os.getpid(), 3600)
    young = pg_dir("cbxpg-young", None, 0)
    other = pg_dir("not-postgres", None, 3600)
    assert sorted(reclaim_dead_postgres(tmp_path)) == sorted([dead, no_pid])
    assert not dead.exists() and not no_pid.exists()
    assert live.exists() and young.exists() and other.exists()


def test_a_failed_tests_data_dir_loses_its_jail_cgroups_too(tmp_path: Path) -> None:
    """``reclaim_data_dir`` (what a test's teardown calls after a failure) removes the VMs' jail cgroups of the
    data dir's tag, which a killed QEMU leaves behind (the suite's host check counts them as leaks)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    controller = next(c for c in ("pids", "cpu", "memory") if (CGROUP_ROOT / c).is_dir())
    base = CGROUP_ROOT / controller / f"cryobox-{tag_for(data_dir)}"
    (base / "vm-test").mkdir(parents=True)
    try:
        reclaim_data_dir(data_dir, None)
        assert not base.exists()
    finally:
        for path in (base / "vm-test", base):
            if path.exists():
                path.rmdir()
