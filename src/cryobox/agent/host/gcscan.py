"""Reading what ``cryobox gc`` decides on off the host (``/proc``, ``/run/netns``, links, nft, ``/dev/shm``), and
the real effects :func:`cryobox.agent.host.gc.apply` uses. Every root is injectable for tests."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...config import DEFAULT_DATA_DIR, Paths
from ...util import procfs
from ..memory.client import is_memory_server
from ..memory.mounts import unmount
from ..vm.cgroups import PREFIX as CGROUP_PREFIX
from ..vm.qemu import is_qemu_argv0
from .gc import DirState, Effects, HostState, ProcInfo
from .ownership import LOCK_NAME, OWNERS_DIR, OwnerRecord, held_by_other, read_owners

Nft = Callable[[list[str]], str]
_OCTAL = re.compile(r"\\([0-7]{3})")


def run_nft(argv: list[str]) -> str:
    """Run ``nft``; its stdout (an error when it fails)."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Roots:
    proc: Path = procfs.PROC
    owners: Path = OWNERS_DIR
    netns: Path = Path("/run/netns")
    net: Path = Path("/sys/class/net")
    shm: Path = Path("/dev/shm")
    mountinfo: Path = Path("/proc/self/mountinfo")
    nft: Nft = field(default=run_nft)
    cgroup: Path = Path("/sys/fs/cgroup")


def dir_state(data_dir: str) -> DirState:
    if held_by_other(Path(data_dir)):
        return DirState.LOCKED
    return DirState.IDLE if (Path(data_dir) / LOCK_NAME).exists() else DirState.GONE


def runs_cryobox(argv: list[str] | tuple[str, ...]) -> bool:
    """Whether the process is cryobox itself (``cryobox …``, ``python -m cryobox…``, ``python …/bin/cryobox``),
    not a program that only names it in its arguments (``timeout 60 cryobox gc --data-dir D``, an editor, a shell)."""
    if not argv:
        return False
    program = os.path.basename(argv[0])
    if program == "cryobox":
        return True
    if not program.startswith("python"):
        return False
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg == "-m":
            return bool(rest) and rest[0].split(".")[0] == "cryobox"
        if arg in ("-c", "-"):
            return False
        if not arg.startswith("-"):
            return os.path.basename(arg) == "cryobox"
        if arg in ("-W", "-X"):  # options with a value
            rest = rest[1:]
    return False


def _data_dir_of(pid: int, argv: list[str], proc: Path) -> str | None:
    """The data dir a cryobox agent runs on: ``--data-dir``, else ``CRYOBOX_DATA_DIR``, else the default."""
    if not runs_cryobox(argv) or is_memory_server(argv):
        return None
    value = procfs.flag_value(argv, "--data-dir")
    value = value or next((a.split("=", 1)[1] for a in argv if a.startswith("--data-dir=")), None)
    if value is None:
        with contextlib.suppress(OSError):
            env = (proc / str(pid) / "environ").read_bytes().split(b"\0")
            value = next((e[17:].decode() for e in env if e.startswith(b"CRYOBOX_DATA_DIR=")), None)
    path = Path(value) if value else DEFAULT_DATA_DIR
    if not path.is_absolute():
        with contextlib.suppress(OSError):
            path = Path(os.readlink(proc / str(pid) / "cwd")) / path
    return os.path.normpath(path)


def _links_of(pid: int, proc: Path) -> list[str]:
    with contextlib.suppress(OSError):
        fds = proc / str(pid) / "fd"
        return [os.readlink(fd).removesuffix(" (deleted)") for fd in fds.iterdir() if fd.name.isdigit()]
    return []


def _shm_files(pid: int, proc: Path, shm: Path) -> frozenset[str]:
    prefix = f"{shm}/cryobox-"
    found = {link for link in _links_of(pid, proc) if link.startswith(prefix)}
    with contextlib.suppress(OSError):
        for line in (proc / str(pid) / "maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(prefix):
                found.add(parts[5].removesuffix(" (deleted)"))
    return frozenset(found)


def processes(roots: Roots, owner_pids: Iterable[int], deep: bool) -> tuple[ProcInfo, ...]:
    """The live processes gc cares about (QEMUs, memory servers, cryobox processes, record pids; with ``deep``
    every process, with its netns and the ``/dev/shm/cryobox-*`` files it uses)."""
    owners = set(owner_pids)
    found = []
    for pid in procfs.pids(roots.proc):
        argv = procfs.cmdline(pid, roots.proc)
        if not argv or not procfs.alive(pid, roots.proc):
            continue
        relevant = is_qemu_argv0(argv[0]) or any("cryobox" in a for a in argv) or pid in owners
        if not relevant and not deep:
            continue
        locks = frozenset(f for f in _links_of(pid, roots.proc) if f.endswith("/" + LOCK_NAME)) if relevant else None
        ino = None
        if deep:
            with contextlib.suppress(OSError):
                ino = os.stat(roots.proc / str(pid) / "ns" / "net").st_ino
        found.append(
            ProcInfo(
                pid=pid,
                argv=tuple(argv),
                data_dir=_data_dir_of(pid, argv, roots.proc),
                locks=locks or frozenset(),
                netns_ino=ino,
                shm_files=_shm_files(pid, roots.proc, roots.shm) if deep else frozenset(),
            )
        )
    return tuple(found)


def mount_points(mountinfo: Path) -> tuple[str, ...]:
    points = []
    with contextlib.suppress(OSError):
        for line in mountinfo.read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                points.append(_OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4]))  # \040 is a space, ...
    return tuple(points)


def netns_names(root: Path) -> dict[str, int]:
    names: dict[str, int] = {}
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            names[entry.name] = os.stat(entry).st_ino
        except OSError:
            names[entry.name] = 0
    return names


def nft_tables(nft: Nft) -> tuple[str, ...]:
    try:
        out = nft(["nft", "list", "tables", "inet"])
    except (OSError, RuntimeError):
        return ()
    rows = (line.split() for line in out.splitlines())
    return tuple(row[2] for row in rows if len(row) > 2 and row[:2] == ["table", "inet"])


def explicit_record(data_dir: Path, owners: Iterable[OwnerRecord]) -> OwnerRecord:
    """The record of ``--data-dir``: its own when it has one, else computed from its paths (pid 0)."""
    paths = Paths(data_dir.resolve(), cache_dir=Path("/nonexistent"))
    computed = OwnerRecord.for_paths(paths, pid=0, started_at=0.0)
    return next((r for r in owners if r.tag == computed.tag and r.data_dir == computed.data_dir), computed)


def scan(roots: Roots, explicit: Path | None = None, deep: bool = False) -> tuple[HostState, OwnerRecord | None]:
    owners = tuple(read_owners(roots.owners))
    record = explicit_record(explicit, owners) if explicit is not None else None
    named = [r.data_dir for r in owners] + ([record.data_dir] if record is not None else [])
    hot = [r.hot_dir for r in owners] + ([record.hot_dir] if record is not None else [])
    shm = tuple(str(p) for p in sorted(roots.shm.glob("cryobox-*")) if p.is_dir()) if roots.shm.is_dir() else ()
    state = HostState(
        owners=owners,
        dirs={d: dir_state(d) for d in named},
        processes=processes(roots, [r.pid for r in owners], deep),
        mounts=mount_points(roots.mountinfo),
        netns=netns_names(roots.netns),
        links=tuple(sorted(os.listdir(roots.net))) if roots.net.is_dir() else (),
        nft_tables=nft_tables(roots.nft),
        shm_dirs=shm,
        present=frozenset(h for h in hot if Path(h).is_dir()),
        own_pid=os.getpid(),
        cgroup_tags=cgroup_tags(roots.cgroup),
    )
    return state, record


def _tag_dirs(root: Path) -> Iterator[Path]:
    """Every per-agent cgroup directory (``cryobox-<tag>``) at any depth under ``root``, not looking below one.

    A directory that goes while it is walked (an agent deleting a VM meanwhile: its cgroup is removed) is skipped:
    ``Path.glob`` raised ``FileNotFoundError`` out of ``cryobox gc`` there (the suite's other worker caught it)."""
    for parent, dirnames, _ in os.walk(root):  # errors (a directory gone meanwhile) are skipped, not raised
        ours = [d for d in dirnames if d.startswith(CGROUP_PREFIX)]
        yield from (Path(parent) / d for d in ours)
        dirnames[:] = [d for d in dirnames if d not in ours]  # only VM cgroups below one of ours


def cgroup_tags(root: Path) -> tuple[str, ...]:
    """Tags of the jail's per-agent cgroup directories (``cryobox-<tag>`` at any depth under ``root``)."""
    return tuple(sorted({d.name.removeprefix(CGROUP_PREFIX) for d in _tag_dirs(root)}))


def remove_cgroups(root: Path, tag: str) -> int:
    """Remove every (empty) VM cgroup of ``tag`` and then its per-agent directories; returns how many went. A
    cgroup already gone (its agent removed it meanwhile) is not an error."""
    removed = 0
    for base in sorted(d for d in _tag_dirs(root) if d.name == f"{CGROUP_PREFIX}{tag}"):
        with contextlib.suppress(FileNotFoundError):
            for child in [c for c in base.iterdir() if c.is_dir()]:
                with contextlib.suppress(FileNotFoundError):
                    child.rmdir()
                    removed += 1
            base.rmdir()
    return removed


def host_effects(roots: Roots) -> Effects:
    from pyroute2 import netns as pyroute_netns

    from ..net.firewall import release_forwarding
    from ..net.netlink import reclaim

    def nft(argv: list[str]) -> None:
        roots.nft(argv)
        if argv[:2] == ["nft", "delete"]:  # a table gone: the last one takes the routing forward mode turned on
            release_forwarding()

    return Effects(
        kill=os.kill,
        alive=lambda pid: procfs.alive(pid, roots.proc),
        unmount=unmount,
        reclaim_net=reclaim,
        remove_netns=pyroute_netns.remove,
        nft=nft,
        owners_dir=roots.owners,
        reclaim_cgroups=lambda tag: remove_cgroups(roots.cgroup, tag),
    )
