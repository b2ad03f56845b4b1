"""Last-resort cleanup of everything a ``cryobox serve``/``agent`` with one data dir may leave running (its
VMs outlive it by design): every process naming the data dir, the memory server's mount, the volume, the hot
directory, network namespaces and the nft table of its tag (:func:`cryobox.bench.restart.host.reclaim_data_dir`,
one data dir's; here, what a whole interrupted run left)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from cryobox.agent.host.ownership import owners_dir_from_env, read_owners, remove_owner
from cryobox.agent.net.firewall import remove_table
from cryobox.agent.net.netlink import reclaim as reclaim_net
from cryobox.agent.net.slots import tag_for
from cryobox.bench.restart.host import processes_naming as processes_naming
from cryobox.bench.restart.host import reclaim_data_dir as reclaim_data_dir  # the bench's, shared by the tests

CGROUP_ROOT = Path("/sys/fs/cgroup")


def forget_owner_records(root: Path) -> int:
    """Remove the owner records of the suite's data dirs (under ``root``) that are gone, as ``cryobox gc`` would:
    a stopped agent leaves its record for ``gc``, and every start reads them all. Returns how many went."""
    owners, prefix = owners_dir_from_env(), f"{root.resolve()}/"
    gone = [r for r in read_owners(owners) if r.data_dir.startswith(prefix) and not Path(r.data_dir).exists()]
    return sum(remove_owner(record.tag, owners) for record in gone)


def reclaim_previous_run(root: Path) -> list[str]:
    """What an interrupted earlier run left under the suite's base temp dir ``root`` (the process killed, the
    host restarted mid-run): its processes, its mounts (pytest's own cleanup of ``root`` fails on a mount point,
    before any test runs) and the network objects of every data dir under it. Returns what went."""
    if not root.is_dir():
        return []
    gone: list[str] = []
    ours = _ancestors()  # this run's own command line names the base temp dir, and so may its wrappers'
    for pid in (p for p in processes_naming(root) if p not in ours):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            gone.append(f"process {pid}")
    for point in _mounts_under(root):  # deepest first
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        gone.append(f"mount {point}")
    tags = _live_tags()
    for directory in _dirs(root, depth=4):
        tag = tag_for(directory)
        if tag in tags:
            reclaim_net(tag)
            remove_table(tag)
            gone.append(f"network objects tagged {tag}")
            tags.discard(tag)
    return gone


def reclaim_dead_postgres(parent: Path, *, min_age_s: float = 600.0) -> list[Path]:
    """The directories of throwaway PostgreSQL servers (``tests/support/pg.py``) a killed run left in ``parent``:
    no postmaster alive for them and older than ``min_age_s`` (a younger one may be another run's initdb)."""
    gone = []
    for root in parent.glob("cbxpg-*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((root / "data" / "postmaster.pid").read_text().splitlines()[0])
            if Path(f"/proc/{pid}").exists():
                continue
        with contextlib.suppress(OSError):
            if time.time() - root.stat().st_mtime < min_age_s:
                continue
            shutil.rmtree(root)
            gone.append(root)
    return gone


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    return sorted(points, key=lambda p: p.count("/"), reverse=True)


def _live_tags() -> set[str]:
    """Tags named by a ``cryobox-<tag>-…`` network namespace or a ``cryobox_<tag>`` nft table on this host."""
    tags: set[str] = set()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    tags.update(line.split()[0][8:14] for line in netns.splitlines() if line.startswith("cryobox-"))
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
    tags.update(line.split()[-1][8:14] for line in tables.splitlines() if " cryobox_" in line)
    return tags


def _dirs(root: Path, depth: int) -> list[Path]:
    found, level = [root], [root]
    for _ in range(depth):
        level = [child for parent in level for child in _subdirs(parent)]
        found.extend(level)
    return found


def _subdirs(path: Path) -> list[Path]:
    try:
        return [child for child in path.iterdir() if child.is_dir() and not child.is_symlink()]
    except OSError:
        return []


def sweep_shared_store(grace_s: float = 600.0) -> str:
    """Collect the machine's shared object store the way ``cryobox gc --store`` does, consulting this machine's
    registries: what the suite's data dirs stored goes once their registries are gone (a passed run removed its
    base temp dir; a failed run's goes when the next run's start empties it). Chunks younger than ``grace_s``
    wait for the next run (another process on the machine may be publishing). Returns a one-line summary."""
    from cryobox.config import Paths
    from cryobox.objstore.client import open_store
    from cryobox.objstore.gc import GcPolicy, collect
    from cryobox.registry.oracle import RegistryOracle, machine_id

    url = Paths.from_env().default_store_url
    report = collect(open_store(url), GcPolicy(grace_s=grace_s), oracle=RegistryOracle(machine_id()))
    disowned = {r.group for r in report.removed if r.kind == "disowned"}
    return (
        f"store {url}: removed {report.removed_objects} objects ({report.removed_bytes >> 20} MiB, "
        f"{len(disowned)} images of registries gone), kept {report.kept_bytes >> 20} MiB"
    )
