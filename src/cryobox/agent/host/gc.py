"""``cryobox gc``: reclaim the host resources of data dirs that will never start again.

An agent reclaims its own leftovers when it starts again; a data dir that never will (a test's deleted tmp dir,
a crashed install that was wiped) leaves them forever: QEMUs and its memory server, mounts (the data volume, the
FUSE mount), network namespaces and links, its nft table, its hot dir on tmpfs. The owner records
(:mod:`.ownership`) name them: a record whose data dir is **gone** (its ``agent.lock`` is missing: deleted, maybe
except busy mount points) and whose agent no longer holds that lock is dead, and everything carrying its tag or
lying under its data dir is reclaimed. With an explicit data dir, that one is reclaimed if nobody holds its lock.

``all_unowned`` also takes what no record claims: ``/dev/shm/cryobox-*`` dirs, netns/link tags and
``inet cryobox_<tag>`` tables whose tag is neither a record's nor that of a data dir a live cryobox process or
QEMU uses, and that no live process uses (maps a file in, runs inside), plus bake namespaces of dead processes.

:func:`plan` is pure (from a :class:`HostState` that :mod:`.gcscan` reads off the host); :func:`apply` acts.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..memory.client import is_memory_server
from ..net.slots import LINK_PREFIX, NETNS_PREFIX, link_prefix, netns_prefix
from ..vm.qemu import is_qemu_argv0
from .ownership import OwnerRecord

log = logging.getLogger(__name__)

BAKE_NETNS = re.compile(r"^cryobox-bake-(?P<pid>\d+)-")
SHM_DIR = re.compile(r"^cryobox-(?P<digest>[0-9a-f]{12})$")
TAG = re.compile(r"^[0-9a-f]{6}$")
UNOWNED = "unowned"


class DirState(enum.Enum):
    GONE = "gone"  # no agent.lock: deleted
    IDLE = "idle"  # there, nobody holds its lock
    LOCKED = "locked"  # a live agent holds its lock


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    argv: tuple[str, ...]
    data_dir: str | None = None
    """For a cryobox process (not a memory server): the data dir it runs on (``--data-dir``, env, default)."""
    locks: frozenset[str] = frozenset()
    """``agent.lock`` files it holds open (read from its fds; a deleted one without the `` (deleted)``)."""
    netns_ino: int | None = None
    shm_files: frozenset[str] = frozenset()
    """Files under ``/dev/shm/cryobox-*`` it maps or has open."""


@dataclass(frozen=True)
class HostState:
    owners: tuple[OwnerRecord, ...] = ()
    dirs: Mapping[str, DirState] = field(default_factory=dict)
    processes: tuple[ProcInfo, ...] = ()
    mounts: tuple[str, ...] = ()
    netns: Mapping[str, int] = field(default_factory=dict)
    """Namespace names under ``/run/netns`` and their inode (0: unknown)."""
    links: tuple[str, ...] = ()
    nft_tables: tuple[str, ...] = ()
    """``inet`` table names."""
    shm_dirs: tuple[str, ...] = ()
    present: frozenset[str] = frozenset()
    """The owners' hot dirs that exist."""
    own_pid: int = 0
    cgroup_tags: tuple[str, ...] = ()
    """Tags with a jail cgroup directory (``cryobox-<tag>``) under some controller."""


@dataclass(frozen=True)
class Action:
    kind: str
    """``kill``, ``unmount``, ``netns``, ``link``, ``nft``, ``cgroup``, ``hot_dir``, ``record``."""
    target: str
    owner: str
    """The data dir it belonged to, or ``unowned``."""
    tag: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "target": self.target, "owner": self.owner, "tag": self.tag}


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    vms: list[str] = field(default_factory=list)
    """The pids among the ``kill`` actions that are VMs (QEMU): sandboxes whose memory a reclaim loses."""

    def of(self, kind: str) -> list[str]:
        return [a.target for a in self.actions if a.kind == kind]


def tag_of(data_dir: str) -> str:
    """:func:`~cryobox.agent.net.slots.tag_for` of an already resolved path (no filesystem access)."""
    return hashlib.sha256(data_dir.encode()).hexdigest()[:6]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None


def _is_qemu(p: ProcInfo) -> bool:
    return bool(p.argv) and is_qemu_argv0(p.argv[0])


def _is_memserver(p: ProcInfo) -> bool:
    return is_memory_server(p.argv)


def qemu_data_dir(p: ProcInfo) -> str | None:
    """The data dir a QEMU belongs to: its ``-pidfile`` under ``<data>/vol/run/`` or ``<data>/bake/``."""
    pidfile = _flag(p.argv, "-pidfile") if _is_qemu(p) else None
    for marker in ("/vol/run/", "/bake/"):
        if pidfile is not None and marker in pidfile:
            return pidfile[: pidfile.index(marker)]
    return None


def _owner_alive(record: OwnerRecord, state: HostState) -> bool:
    lock = f"{record.data_dir.rstrip('/')}/agent.lock"
    return any(p.pid == record.pid and lock in p.locks for p in state.processes)


def _live_dirs(state: HostState) -> set[str]:
    """Data dirs some live process uses: cryobox agents (by their arguments), QEMUs (by their pidfile)."""
    dirs = {p.data_dir for p in state.processes if p.data_dir and p.pid != state.own_pid}
    return dirs | {d for p in state.processes if (d := qemu_data_dir(p)) is not None}


def _reclaim_owner(plan: Plan, state: HostState, tag: str, data_dir: str, hot_dir: str, gone: bool) -> None:
    owner = data_dir
    for p in state.processes:
        vm = (qemu_data_dir(p) or "") == data_dir
        if vm or (_is_memserver(p) and _under(_flag(p.argv, "--mount") or "", f"{data_dir}/memserver")):
            plan.actions.append(Action("kill", str(p.pid), owner, tag))
            if vm:
                plan.vms.append(str(p.pid))
    for mount in sorted((m for m in state.mounts if _under(m, data_dir)), key=lambda m: (-m.count("/"), m)):
        plan.actions.append(Action("unmount", mount, owner, tag))
    plan.actions += [Action("netns", n, owner, tag) for n in sorted(state.netns) if n.startswith(netns_prefix(tag))]
    plan.actions += [Action("link", n, owner, tag) for n in sorted(state.links) if n.startswith(link_prefix(tag))]
    if f"cryobox_{tag}" in state.nft_tables:
        plan.actions.append(Action("nft", f"cryobox_{tag}", owner, tag))
    if tag in state.cgroup_tags:
        plan.actions.append(Action("cgroup", tag, owner, tag))
    if hot_dir in state.present:
        plan.actions.append(Action("hot_dir", hot_dir, owner, tag))
    if gone and any(r.tag == tag for r in state.owners):
        plan.actions.append(Action("record", tag, owner, tag))


def plan(state: HostState, explicit: OwnerRecord | None = None, all_unowned: bool = False) -> Plan:
    """What to reclaim. ``explicit``: the record of ``--data-dir`` (computed for it when it has none)."""
    result = Plan()
    live = _live_dirs(state)
    dead: list[tuple[OwnerRecord, bool]] = []
    if explicit is not None:
        dir_state = state.dirs.get(explicit.data_dir, DirState.GONE)
        if dir_state is DirState.LOCKED:
            result.skipped.append(f"{explicit.data_dir}: in use (a live agent holds its lock)")
        elif explicit.data_dir in {p.data_dir for p in state.processes if p.pid != state.own_pid}:
            result.skipped.append(f"{explicit.data_dir}: a live cryobox process runs on it")
        else:
            dead.append((explicit, dir_state is DirState.GONE))
    else:
        for record in state.owners:
            if state.dirs.get(record.data_dir, DirState.GONE) is not DirState.GONE:
                continue  # it may start again: reclaimed by its own next start (or gc --data-dir)
            if _owner_alive(record, state) or record.data_dir in {p.data_dir for p in state.processes}:
                result.skipped.append(f"{record.data_dir}: deleted, but its agent (pid {record.pid}) still runs")
                continue
            dead.append((record, True))
    for record, gone in dead:
        _reclaim_owner(result, state, record.tag, record.data_dir, record.hot_dir, gone)
    if all_unowned:
        _unowned(result, state, claimed={r.tag for r in state.owners} | {tag_of(d) for d in live})
    return result


def _unowned(plan: Plan, state: HostState, claimed: set[str]) -> None:
    taken = {a.target for a in plan.actions}
    in_netns = {p.netns_ino for p in state.processes if p.netns_ino}
    used_shm = {f for p in state.processes for f in p.shm_files}
    owned_hot = {r.hot_dir for r in state.owners}
    busy: set[str] = set()
    for name, ino in state.netns.items():
        tag = name[len(NETNS_PREFIX) :].split("-", 1)[0]
        if TAG.match(tag) and ino and ino in in_netns:
            busy.add(tag)
    for path in sorted(state.shm_dirs):
        match = SHM_DIR.match(Path(path).name)
        if match is None or path in owned_hot or path in taken:
            continue
        tag = match["digest"][:6]
        if tag in claimed or any(_under(f, path) for f in used_shm):
            busy.add(tag)
            continue
        plan.actions.append(Action("hot_dir", path, UNOWNED, tag))
    pids = {p.pid for p in state.processes}
    for name in sorted(state.netns):
        bake = BAKE_NETNS.match(name)
        if bake is not None:
            if int(bake["pid"]) not in pids:
                plan.actions.append(Action("netns", name, UNOWNED))
            continue
        if name.startswith(NETNS_PREFIX) and name not in taken:
            tag = name[len(NETNS_PREFIX) :].split("-", 1)[0]
            if TAG.match(tag) and tag not in claimed and tag not in busy:
                plan.actions.append(Action("netns", name, UNOWNED, tag))
    for name in sorted(state.links):
        tag = name[len(LINK_PREFIX) : len(LINK_PREFIX) + 6]
        if name.startswith(link_prefix(tag)) and TAG.match(tag) and name not in taken:
            if tag not in claimed and tag not in busy:
                plan.actions.append(Action("link", name, UNOWNED, tag))
    for table in sorted(state.nft_tables):
        tag = table.removeprefix("cryobox_")
        if table.startswith("cryobox_") and TAG.match(tag) and table not in taken:
            if tag not in claimed and tag not in busy:
                plan.actions.append(Action("nft", table, UNOWNED, tag))
    for tag in state.cgroup_tags:
        if TAG.match(tag) and tag not in claimed and tag not in busy:
            plan.actions.append(Action("cgroup", tag, UNOWNED, tag))
    for tag in sorted(busy - claimed):
        plan.skipped.append(f"tag {tag}: no owner record, but a live process uses its namespaces or hot dir")


@dataclass(frozen=True)
class Effects:
    """What :func:`apply` does to the host (injected by tests)."""

    kill: Callable[[int, int], None]
    alive: Callable[[int], bool]
    unmount: Callable[[Path], None]
    reclaim_net: Callable[[str], object]
    """Removes every netns and link of a tag (:func:`cryobox.agent.net.netlink.reclaim`)."""
    remove_netns: Callable[[str], object]
    nft: Callable[[list[str]], None]
    rmtree: Callable[[Path], None] = shutil.rmtree
    owners_dir: Path = Path("/run/cryobox/owners")
    reclaim_cgroups: Callable[[str], object] = lambda tag: None
    """Removes a tag's (empty, once its QEMUs are killed) jail cgroups."""
    wait_s: float = 5.0


@dataclass(frozen=True)
class Outcome:
    action: Action
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {**self.action.to_json(), "ok": self.error is None, "error": self.error}


def apply(plan: Plan, fx: Effects) -> list[Outcome]:
    """Carry the plan out, in dependency order: processes, mounts, network, tables, hot dirs, records. One
    failure never stops the rest: each action's error is in its outcome."""
    outcomes: list[Outcome] = []

    def run(action: Action) -> None:
        try:
            _do(fx, action)
        except Exception as err:
            log.warning("gc: %s %s failed: %s", action.kind, action.target, err)
            outcomes.append(Outcome(action, f"{type(err).__name__}: {err}"))
        else:
            outcomes.append(Outcome(action))

    kills = [a for a in plan.actions if a.kind == "kill"]
    for action in kills:
        run(action)
    _wait_gone(fx, [int(a.target) for a in kills])
    netted: set[str] = set()
    for action in (a for a in plan.actions if a.kind != "kill"):
        if action.kind in ("netns", "link") and action.tag is not None:
            if action.tag in netted:  # one reclaim per tag removes all its namespaces and links
                outcomes.append(Outcome(action))
                continue
            netted.add(action.tag)
        run(action)
    return outcomes


def _do(fx: Effects, action: Action) -> None:
    kind, target = action.kind, action.target
    if kind == "kill":
        with contextlib.suppress(ProcessLookupError):
            fx.kill(int(target), signal.SIGKILL)
    elif kind == "unmount":
        fx.unmount(Path(target))
    elif kind in ("netns", "link") and action.tag is not None:
        fx.reclaim_net(action.tag)
    elif kind == "netns":
        fx.remove_netns(target)
    elif kind == "nft":
        fx.nft(["nft", "delete", "table", "inet", target])
    elif kind == "cgroup":
        fx.reclaim_cgroups(target)
    elif kind == "hot_dir":
        path = Path(target)
        if not path.is_absolute() or len(path.parts) < 3:
            raise ValueError(f"refusing to remove {path}: not a hot dir")
        fx.rmtree(path)
    elif kind == "record":
        (fx.owners_dir / f"{target}.json").unlink(missing_ok=True)
    else:
        raise ValueError(f"unknown gc action {kind!r}")


def _wait_gone(fx: Effects, pids: list[int]) -> None:
    deadline = time.monotonic() + fx.wait_s
    for pid in pids:
        while fx.alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
            time.sleep(0.01)


def summary(outcomes: Iterable[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.error is None:
            counts[outcome.action.kind] = counts.get(outcome.action.kind, 0) + 1
    return counts
