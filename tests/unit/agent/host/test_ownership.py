"""The data dir's agent lock (one live agent per data dir) and the owner record that outlives the agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.host.ownership import (
    OwnerLock,
    OwnerRecord,
    Ownership,
    held_by_other,
    owners_dir_from_env,
    read_owners,
    remove_owner,
    write_owner,
)
from cryobox.agent.net.slots import pick_cidr, tag_for
from cryobox.config import Paths
from cryobox.errors import StateError

HOLD = """
import sys, time
from pathlib import Path
from cryobox.agent.host.ownership import OwnerLock
lock = OwnerLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tmp_path / 'data'``'s lock."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "data")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_second_agent_is_refused_while_another_holds_the_lock(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    data = tmp_path / "data"
    assert held_by_other(data)
    with pytest.raises(StateError) as info:
        OwnerLock(data, wait_s=0.05).acquire()
    assert str(holder.pid) in info.value.message and str(data) in info.value.message
    assert info.value.code == "wrong_state"
    assert held_by_other(data)  # probing does not take it

    holder.kill()
    holder.wait()  # the kernel drops the lock with the process, however it died
    assert not held_by_other(data)
    with OwnerLock(data) as lock:
        assert lock.held
        assert not held_by_other(data)  # this process is the holder, not another one
    assert not lock.held


def test_acquire_waits_out_a_momentary_probe(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    now = [0.0]
    tries: list[float] = []

    def sleep(seconds: float) -> None:
        tries.append(seconds)
        now[0] += seconds

    first = OwnerLock(data).acquire()
    with pytest.raises(StateError):
        OwnerLock(data, wait_s=0.1, clock=lambda: now[0], sleep=sleep).acquire()
    assert len(tries) >= 5  # retried until its deadline before giving up
    first.release()


def test_no_lock_file_means_nobody_holds_it(tmp_path: Path) -> None:
    assert not held_by_other(tmp_path / "never-used")
    assert not held_by_other(tmp_path / "deleted" / "entirely")


def test_owner_records_round_trip_and_claim_writes_one(tmp_path: Path) -> None:
    owners = tmp_path / "owners"
    paths = Paths(tmp_path / "data", tmp_path / "cache", hot_dir=Path("/dev/shm/cryobox-test"))
    ownership = Ownership(paths, owners).claim()
    try:
        (written,) = read_owners(owners)
        assert written.tag == tag_for(paths.data_dir) and written.data_dir == str(paths.data_dir.resolve())
        assert written.hot_dir == "/dev/shm/cryobox-test" and written.pid > 0 and written.started_at > 0
        on_disk = json.loads((owners / f"{written.tag}.json").read_text())
        assert set(on_disk) == {"tag", "data_dir", "hot_dir", "pid", "started_at", "uid_base", "slot_cidr"}
        assert list(owners.iterdir()) == [owners / f"{written.tag}.json"]  # no temp file left behind
        with pytest.raises(StateError):
            Ownership(paths, owners).claim()  # a second claim in the same process is refused too
    finally:
        ownership.release()
    assert read_owners(owners) == [written]  # the record outlives the agent

    other = OwnerRecord("abcdef", "/x", "/dev/shm/cryobox-x", 1, time.time())
    write_owner(other, owners)
    (owners / "junk.json").write_text("{not json")
    assert sorted(r.tag for r in read_owners(owners)) == sorted([written.tag, "abcdef"])
    assert remove_owner("abcdef", owners) and not remove_owner("abcdef", owners)


def test_a_jail_uid_range_in_use_by_another_running_agent_is_refused(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    owners = tmp_path / "owners"
    theirs = OwnerRecord("abc123", str((tmp_path / "data").resolve()), "/dev/shm/x", holder.pid, 1.0, 5_000_000)
    write_owner(theirs, owners)  # the agent of tmp_path/data runs (holder) with uids from 5,000,000
    paths = Paths(tmp_path / "mine", tmp_path / "cache", hot_dir=Path("/dev/shm/cryobox-mine"))
    with pytest.raises(StateError) as refused:
        Ownership(paths, owners).claim(uid_base=5_000_000)
    assert "CRYOBOX_JAIL_UID_BASE" in refused.value.message and str(tmp_path / "data") in refused.value.message
    assert not held_by_other(paths.data_dir) and [r.tag for r in read_owners(owners)] == ["abc123"]  # nothing taken
    ownership = Ownership(paths, owners).claim(uid_base=5_065_536)  # another range is fine
    try:
        assert {r.uid_base for r in read_owners(owners)} == {5_000_000, 5_065_536}
    finally:
        ownership.release()
    holder.kill()
    holder.wait()
    Ownership(paths, owners).claim(uid_base=5_000_000).release()  # a stopped agent's range is free again


def test_owners_dir_from_env() -> None:
    assert owners_dir_from_env({}) == Path("/run/cryobox/owners")
    assert owners_dir_from_env({"CRYOBOX_OWNERS_DIR": "/tmp/o"}) == Path("/tmp/o")


CLAIM_SLOTS = """
import sys, time
from pathlib import Path
from cryobox.agent.host.ownership import Ownership
from cryobox.agent.net.slots import pick_cidr
from cryobox.config import Paths

root, owners = Path(sys.argv[1]), Path(sys.argv[2])
paths = Paths(root / "data", root / "cache", hot_dir=Path("/dev/shm/cryobox-unused"))
ownership = Ownership(paths, owners).claim()

def routes():
    time.sleep(0.3)  # a slow routing-table dump: the other agent starts meanwhile
    return []  # neither agent has built a slot yet, so the routes show nothing of either

print(ownership.claim_slots(pick_cidr, routes), flush=True)
sys.stdin.read()  # run until the test closes stdin
"""


def test_agents_starting_at_once_on_one_host_pick_different_slot_networks(tmp_path: Path) -> None:
    """The routing table shows no slot of an agent that has not built one yet: two agents starting together used to
    both pick 10.200.0.0/16, and the host then reached one agent's guests in the other's namespaces."""
    owners = tmp_path / "owners"
    agents = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIM_SLOTS, str(tmp_path / name), str(owners)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        picked = [agent.stdout.readline().strip() for agent in agents if agent.stdout is not None]
        assert sorted(picked) == ["10.200.0.0/16", "10.201.0.0/16"], picked
        assert sorted(r.slot_cidr or "" for r in read_owners(owners)) == sorted(picked)  # recorded for the next
        first = agents[picked.index("10.200.0.0/16")]
        assert first.stdin is not None
        first.stdin.close()
        first.wait(timeout=30)
        # a stopped agent's network is free again (its record stays for `cryobox gc`, but its lock is gone)
        paths = Paths(tmp_path / "c" / "data", tmp_path / "c" / "cache", hot_dir=Path("/dev/shm/cryobox-unused"))
        ownership = Ownership(paths, owners).claim()
        try:
            assert ownership.claim_slots(pick_cidr, list) == "10.200.0.0/16"
        finally:
            ownership.release()
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
            for stream in (agent.stdin, agent.stdout):
                if stream is not None:
                    stream.close()


def test_the_slot_network_is_claimed_only_after_the_data_dir(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "data", tmp_path / "cache", hot_dir=Path("/dev/shm/cryobox-unused"))
    with pytest.raises(StateError):
        Ownership(paths, tmp_path / "owners").claim_slots(pick_cidr, list)
