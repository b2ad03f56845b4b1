"""The suite's own start: an interrupted earlier run's mounts and network objects under the base temp dir are
reclaimed before pytest empties it (a mount point left there once stopped a CI run before its first test)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryobox.agent.net.slots import tag_for
from tests.support.teardown import reclaim_previous_run


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
