"""``cryobox gc``'s plan (pure, from an injected host state) and its apply order with fake effects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cryobox.agent.host.gc import Action, DirState, Effects, HostState, Plan, ProcInfo, apply, plan, tag_of
from cryobox.agent.host.gcscan import cgroup_tags, remove_cgroups, runs_cryobox
from cryobox.agent.host.ownership import OwnerRecord

GONE_DIR = "/tmp/t/gone"
LIVE_DIR = "/tmp/t/live"
TAG_GONE, TAG_LIVE = tag_of(GONE_DIR), tag_of(LIVE_DIR)


def record(data_dir: str, pid: int = 4000) -> OwnerRecord:
    tag = tag_of(data_dir)
    return OwnerRecord(tag, data_dir, f"/dev/shm/cryobox-{tag}aaaaaa", pid, 1.0)


def qemu(pid: int, pidfile: str) -> ProcInfo:
    return ProcInfo(pid, ("/usr/bin/qemu-system-x86_64", "-name", "x", "-pidfile", pidfile))


def host(**overrides: object) -> HostState:
    gone, live = record(GONE_DIR), record(LIVE_DIR, pid=4001)
    values: dict[str, object] = {
        "owners": (gone, live),
        "dirs": {GONE_DIR: DirState.GONE, LIVE_DIR: DirState.LOCKED},
        "processes": (
            qemu(100, f"{GONE_DIR}/vol/run/vm-1/qemu.pid"),
            qemu(101, f"{GONE_DIR}/bake/bake-abc/qemu.pid"),
            qemu(102, f"{LIVE_DIR}/vol/run/vm-2/qemu.pid"),
            qemu(103, f"{GONE_DIR}x/vol/run/vm-3/qemu.pid"),  # a sibling whose name only starts the same
            ProcInfo(
                110,
                ("/usr/bin/python3", "-m", "cryobox.agent.memory.server.main", "--mount", f"{GONE_DIR}/memserver/mnt"),
            ),
            ProcInfo(
                111,
                ("/usr/bin/python3", "-m", "cryobox.agent.memory.server.main", "--mount", f"{LIVE_DIR}/memserver/mnt"),
            ),
            ProcInfo(
                4001, ("cryobox", "agent", "--data-dir", LIVE_DIR), LIVE_DIR, frozenset({f"{LIVE_DIR}/agent.lock"})
            ),
        ),
        "mounts": ("/", f"{GONE_DIR}/vol", f"{GONE_DIR}/memserver/mnt", f"{LIVE_DIR}/vol", f"{GONE_DIR}x/vol"),
        "netns": {f"cryobox-{TAG_GONE}-0": 1, f"cryobox-{TAG_GONE}-1": 2, f"cryobox-{TAG_LIVE}-0": 3},
        "links": ("lo", "eth0", f"cb{TAG_GONE}h0", f"cb{TAG_LIVE}h0"),
        "nft_tables": (f"cryobox_{TAG_GONE}", f"cryobox_{TAG_LIVE}", "filter"),
        "shm_dirs": (gone.hot_dir, live.hot_dir),
        "present": frozenset({gone.hot_dir, live.hot_dir}),
        "own_pid": 1,
    }
    values.update(overrides)
    return HostState(**values)  # type: ignore[arg-type]


def test_a_gone_data_dir_is_reclaimed_whole_and_nothing_else() -> None:
    result = plan(host())
    assert result.skipped == []
    assert sorted(result.of("kill")) == ["100", "101", "110"]
    assert result.of("unmount") == [f"{GONE_DIR}/memserver/mnt", f"{GONE_DIR}/vol"]  # deepest first
    assert result.of("netns") == [f"cryobox-{TAG_GONE}-0", f"cryobox-{TAG_GONE}-1"]
    assert result.of("link") == [f"cb{TAG_GONE}h0"]
    assert result.of("nft") == [f"cryobox_{TAG_GONE}"]
    assert result.of("hot_dir") == [record(GONE_DIR).hot_dir]
    assert result.of("record") == [TAG_GONE]
    assert {a.owner for a in result.actions} == {GONE_DIR}
    assert {a.tag for a in result.actions} == {TAG_GONE}


def test_a_data_dir_that_exists_is_left_to_its_own_next_start() -> None:
    state = host(dirs={GONE_DIR: DirState.IDLE, LIVE_DIR: DirState.LOCKED})
    assert plan(state).actions == []


def test_a_deleted_data_dir_whose_agent_still_holds_the_lock_is_skipped() -> None:
    gone = record(GONE_DIR)
    holder = ProcInfo(gone.pid, ("python", "-m", "pytest"), None, frozenset({f"{GONE_DIR}/agent.lock"}))
    result = plan(host(processes=(*host().processes, holder)))
    assert result.actions == []
    assert len(result.skipped) == 1 and GONE_DIR in result.skipped[0] and "still runs" in result.skipped[0]
    # the same pid running something else (a reused pid) holds no such lock: the owner is dead
    reused = ProcInfo(gone.pid, ("sleep", "100"))
    assert plan(host(processes=(*host().processes, reused))).of("record") == [TAG_GONE]


def test_an_explicit_data_dir_is_reclaimed_unless_locked() -> None:
    live = record(LIVE_DIR, pid=4001)
    refused = plan(host(), explicit=live)
    assert refused.actions == [] and "in use" in refused.skipped[0]

    unlocked = host(
        dirs={GONE_DIR: DirState.GONE, LIVE_DIR: DirState.IDLE},
        processes=tuple(p for p in host().processes if p.pid != 4001),
    )
    result = plan(unlocked, explicit=live)
    assert sorted(result.of("kill")) == ["102", "111"]
    assert result.of("unmount") == [f"{LIVE_DIR}/vol"]
    assert result.of("netns") == [f"cryobox-{TAG_LIVE}-0"] and result.of("nft") == [f"cryobox_{TAG_LIVE}"]
    assert result.of("hot_dir") == [live.hot_dir]
    assert result.of("record") == []  # the data dir is still there: it may start again
    assert GONE_DIR not in {a.owner for a in result.actions}  # only the data dir asked for

    # a live cryobox process on it (an agent without the lock) protects it too; gc's own process does not
    mine = ProcInfo(77, ("cryobox", "gc", "--data-dir", LIVE_DIR), LIVE_DIR)
    assert plan(host(dirs=unlocked.dirs, processes=(*unlocked.processes, mine), own_pid=77), explicit=live).actions
    other = ProcInfo(78, ("cryobox", "serve", "--data-dir", LIVE_DIR), LIVE_DIR)
    assert plan(host(dirs=unlocked.dirs, processes=(*unlocked.processes, other)), explicit=live).actions == []


def test_unowned_resources_only_with_all_unowned_and_only_unused() -> None:
    idle, busy, claimed = "0a1b2c", "3d4e5f", tag_of("/srv/agent")
    state = host(
        owners=(),
        dirs={},
        processes=(
            ProcInfo(200, ("/usr/bin/qemu-system-x86_64",), netns_ino=42),  # runs inside busy's namespace
            ProcInfo(201, ("cryobox", "serve", "--data-dir", "/srv/agent"), "/srv/agent"),
            ProcInfo(202, ("bash",), shm_files=frozenset({"/dev/shm/cryobox-999999aaaaaa/tpl-base"})),
        ),
        mounts=(),
        netns={
            f"cryobox-{idle}-0": 41,
            f"cryobox-{busy}-0": 42,
            f"cryobox-{claimed}-0": 43,
            "cryobox-bake-999999-abcdef": 44,  # its process is gone
            "cryobox-bake-202-abcdef": 45,  # its process lives
            "unrelated": 46,
        },
        links=("eth0", f"cb{idle}h0", f"cb{busy}h0", f"cb{claimed}h0"),
        nft_tables=(f"cryobox_{idle}", f"cryobox_{busy}", f"cryobox_{claimed}", "filter"),
        shm_dirs=(
            f"/dev/shm/cryobox-{idle}aaaaaa",
            "/dev/shm/cryobox-999999aaaaaa",
            f"/dev/shm/cryobox-{claimed}bbbbbb",
        ),
        present=frozenset(),
    )
    assert plan(state).actions == []
    result = plan(state, all_unowned=True)
    assert result.of("hot_dir") == [f"/dev/shm/cryobox-{idle}aaaaaa"]
    assert result.of("netns") == [f"cryobox-{idle}-0", "cryobox-bake-999999-abcdef"]
    assert result.of("link") == [f"cb{idle}h0"]
    assert result.of("nft") == [f"cryobox_{idle}"]
    assert {a.owner for a in result.actions} == {"unowned"}
    assert any(busy in note for note in result.skipped) and any("999999" in note for note in result.skipped)


class FakeEffects:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.alive_pids = {100, 110}

    def kill(self, pid: int, sig: int) -> None:
        self.calls.append(("kill", str(pid)))
        self.alive_pids.discard(pid)

    def effects(self, owners_dir: Path) -> Effects:
        def fail_unmount(path: Path) -> None:
            self.calls.append(("unmount", str(path)))
            if path.name == "mnt":
                raise OSError("busy")

        return Effects(
            kill=self.kill,
            alive=lambda pid: pid in self.alive_pids,
            unmount=fail_unmount,
            reclaim_net=lambda tag: self.calls.append(("reclaim_net", tag)),
            remove_netns=lambda name: self.calls.append(("remove_netns", name)),
            nft=lambda argv: self.calls.append(("nft", " ".join(argv))),
            rmtree=lambda path: self.calls.append(("rmtree", str(path))),
            owners_dir=owners_dir,
            reclaim_cgroups=lambda tag: self.calls.append(("reclaim_cgroups", tag)),
            wait_s=1.0,
        )


def test_apply_order_one_reclaim_per_tag_and_failures_do_not_stop_it(tmp_path: Path) -> None:
    (tmp_path / f"{TAG_GONE}.json").write_text("{}")
    todo = plan(host())
    todo.actions.append(Action("netns", "cryobox-bake-1-aa", "unowned"))
    fake = FakeEffects()
    outcomes = apply(todo, fake.effects(tmp_path))

    kinds = [kind for kind, _ in fake.calls]
    assert kinds[:3] == ["kill", "kill", "kill"]
    assert fake.calls[3:] == [
        ("unmount", f"{GONE_DIR}/memserver/mnt"),
        ("unmount", f"{GONE_DIR}/vol"),
        ("reclaim_net", TAG_GONE),  # once for two namespaces and a link
        ("nft", f"nft delete table inet cryobox_{TAG_GONE}"),
        ("rmtree", record(GONE_DIR).hot_dir),
        ("remove_netns", "cryobox-bake-1-aa"),
    ]
    assert not (tmp_path / f"{TAG_GONE}.json").exists()
    failed = [o for o in outcomes if o.error is not None]
    assert [o.action.target for o in failed] == [f"{GONE_DIR}/memserver/mnt"] and "busy" in str(failed[0].error)
    assert len(outcomes) == len(todo.actions)


def test_apply_refuses_to_remove_a_suspicious_hot_dir(tmp_path: Path) -> None:
    fake = FakeEffects()
    (outcome,) = apply(Plan([Action("hot_dir", "/", "x")]), fake.effects(tmp_path))
    assert outcome.error is not None and fake.calls == []


CG_TAG = "abc123"
CG_DIR = "/tmp/t/jailed"


def cg_record(data_dir: str = CG_DIR, tag: str = CG_TAG) -> OwnerRecord:
    return OwnerRecord(tag, data_dir, f"/dev/shm/cryobox-{tag}bbbbbb", 4100, 1.0)


def test_a_gone_data_dir_loses_its_cgroups() -> None:
    state = HostState(owners=(cg_record(),), dirs={CG_DIR: DirState.GONE}, cgroup_tags=(CG_TAG, "fedcba"))
    result = plan(state)
    assert Action("cgroup", CG_TAG, CG_DIR, CG_TAG) in result.actions
    assert result.of("cgroup") == [CG_TAG]  # another agent's cgroups are not its to take
    assert result.of("record") == [CG_TAG]
    # the fixture host: only the gone dir's tag, never the live one's
    both = plan(host(cgroup_tags=(TAG_GONE, TAG_LIVE)))
    assert both.of("cgroup") == [TAG_GONE]
    assert plan(host()).of("cgroup") == []  # no cgroup dir, no action


def test_an_existing_or_running_data_dir_keeps_its_cgroups() -> None:
    for dir_state in (DirState.IDLE, DirState.LOCKED):
        state = HostState(owners=(cg_record(),), dirs={CG_DIR: dir_state}, cgroup_tags=(CG_TAG,))
        assert plan(state).of("cgroup") == []
        assert plan(state, all_unowned=True).of("cgroup") == []  # claimed by its record


def test_unowned_cgroups_only_with_all_unowned() -> None:
    busy, claimed = "3d4e5f", tag_of("/srv/agent")
    state = HostState(
        processes=(
            ProcInfo(200, ("/usr/bin/qemu-system-x86_64",), netns_ino=42),  # runs inside busy's namespace
            ProcInfo(201, ("cryobox", "serve", "--data-dir", "/srv/agent"), "/srv/agent"),
        ),
        netns={f"cryobox-{busy}-0": 42},
        cgroup_tags=(CG_TAG, busy, claimed, "bake-1", "ABC123"),
        own_pid=1,
    )
    assert plan(state).actions == []
    result = plan(state, all_unowned=True)
    assert [a for a in result.actions if a.kind == "cgroup"] == [Action("cgroup", CG_TAG, "unowned", CG_TAG)]
    # a record claims its tag: the data dir is still there, so its own next start (or gc of it) reclaims them
    owned = HostState(owners=(cg_record(),), dirs={CG_DIR: DirState.IDLE}, cgroup_tags=(CG_TAG,))
    assert plan(owned, all_unowned=True).actions == []


def test_apply_reclaims_cgroups_after_the_kills(tmp_path: Path) -> None:
    todo = plan(host(cgroup_tags=(TAG_GONE,)))
    fake = FakeEffects()
    outcomes = apply(todo, fake.effects(tmp_path))
    assert ("reclaim_cgroups", TAG_GONE) in fake.calls
    assert [c for c in fake.calls if c[0] == "reclaim_cgroups"] == [("reclaim_cgroups", TAG_GONE)]
    last_kill = max(i for i, (kind, _) in enumerate(fake.calls) if kind == "kill")
    assert fake.calls.index(("reclaim_cgroups", TAG_GONE)) > last_kill
    (cgroup,) = [o for o in outcomes if o.action.kind == "cgroup"]
    assert cgroup.error is None and cgroup.action.target == TAG_GONE


def test_apply_reports_a_failed_cgroup_reclaim(tmp_path: Path) -> None:
    def busy(tag: str) -> None:
        raise OSError(16, "Device or resource busy")

    fx = Effects(
        kill=lambda pid, sig: None,
        alive=lambda pid: False,
        unmount=lambda path: None,
        reclaim_net=lambda tag: None,
        remove_netns=lambda name: None,
        nft=lambda argv: None,
        owners_dir=tmp_path,
        reclaim_cgroups=busy,
    )
    (outcome,) = apply(Plan([Action("cgroup", CG_TAG, "unowned", CG_TAG)]), fx)
    assert outcome.error is not None and "busy" in outcome.error


def _cgroup_tree(root: Path) -> None:
    """Jail cgroups as a v1 host has them, at different depths under each controller (directories only)."""
    for vm in ("vm-1", "vm-2"):
        (root / "memory" / "process_api" / "abc" / f"cryobox-{CG_TAG}" / vm).mkdir(parents=True)
    (root / "cpu,cpuacct" / "process_api" / "abc" / f"cryobox-{CG_TAG}" / "vm-1").mkdir(parents=True)
    (root / "pids" / f"cryobox-{CG_TAG}").mkdir(parents=True)
    (root / "memory" / "cryobox-fedcba" / "vm-9").mkdir(parents=True)
    (root / "memory" / "system.slice").mkdir()
    (root / "memory" / "cryobox-000000").write_text("")  # a file is no cgroup


def test_cgroup_tags_finds_them_at_any_depth(tmp_path: Path) -> None:
    assert cgroup_tags(tmp_path / "missing") == ()
    assert cgroup_tags(tmp_path) == ()
    _cgroup_tree(tmp_path)
    assert cgroup_tags(tmp_path) == (CG_TAG, "fedcba")


def test_cgroup_tags_skips_a_directory_removed_while_it_is_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cgroup_tree(tmp_path)
    gone = tmp_path / "memory" / "process_api"  # an agent removes a cgroup below while gc walks the tree
    scandir = os.scandir

    def racing(path: Any = ".") -> Any:
        if Path(path) == gone:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", racing)
    assert "fedcba" in cgroup_tags(tmp_path)  # the rest is still found, and nothing is raised


def test_remove_cgroups_removes_one_tag_only(tmp_path: Path) -> None:
    _cgroup_tree(tmp_path)

    assert remove_cgroups(tmp_path, CG_TAG) == 3  # two VMs under memory, one under cpu

    assert not list(tmp_path.glob(f"**/cryobox-{CG_TAG}"))
    assert (tmp_path / "memory" / "process_api" / "abc").is_dir()  # the agent's own cgroup stays
    assert (tmp_path / "memory" / "cryobox-fedcba" / "vm-9").is_dir()
    assert cgroup_tags(tmp_path) == ("fedcba",)
    assert remove_cgroups(tmp_path, CG_TAG) == 0  # nothing left: fine


def test_remove_cgroups_while_other_agents_cgroups_come_and_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The glob it walked with raised ``FileNotFoundError`` for a cgroup removed under it meanwhile, as
    :func:`cgroup_tags` did; and a VM cgroup its own agent removed between the listing and the ``rmdir`` is gone,
    not an error."""
    _cgroup_tree(tmp_path)
    gone = tmp_path / "memory" / "system.slice"  # another service's cgroup, removed while the tree is walked
    scandir, rmdir = os.scandir, Path.rmdir
    raced = tmp_path / "cpu,cpuacct" / "process_api" / "abc" / f"cryobox-{CG_TAG}" / "vm-1"

    def racing_scandir(path: Any = ".") -> Any:
        if Path(path) == gone:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    def racing_rmdir(self: Path) -> None:
        if self == raced:
            rmdir(self)  # its agent removed it first
            raise FileNotFoundError(2, "No such file or directory", str(self))
        rmdir(self)

    monkeypatch.setattr(os, "scandir", racing_scandir)
    monkeypatch.setattr(Path, "rmdir", racing_rmdir)
    assert raced.is_dir()
    assert remove_cgroups(tmp_path, CG_TAG) == 2  # the two under memory; the raced one was not this call's
    monkeypatch.undo()
    assert not list(tmp_path.glob(f"**/cryobox-{CG_TAG}"))
    assert cgroup_tags(tmp_path) == ("fedcba",)


def test_only_cryobox_itself_runs_on_a_data_dir() -> None:
    """A wrapper that names cryobox in its arguments (``timeout 120 cryobox gc --data-dir D``) used to count as a
    cryobox process on D, and ``gc --data-dir D`` then refused D ("a live cryobox process runs on it")."""
    assert runs_cryobox(("cryobox", "serve", "--data-dir", "/d"))
    assert runs_cryobox(("/opt/cryobox/venv/bin/cryobox", "agent"))
    assert runs_cryobox(("/usr/bin/python3", "-m", "cryobox.cli.main", "serve"))
    assert runs_cryobox(("/usr/bin/python3.11", "-X", "dev", "-m", "cryobox", "serve"))
    assert runs_cryobox(("python3", "/opt/cryobox/venv/bin/cryobox", "gc"))
    assert not runs_cryobox(("timeout", "120", "cryobox", "gc", "--data-dir", "/d"))
    assert not runs_cryobox(("/usr/bin/python3", "-c", "import cryobox", "--data-dir", "/d"))
    assert not runs_cryobox(("python3", "-m", "pytest", "tests/cryobox"))
    assert not runs_cryobox(("vim", "/etc/cryobox/cryobox.env"))
    assert not runs_cryobox(())
