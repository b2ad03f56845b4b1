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
from cryobox.agent.net.slots import tag_for
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
        assert set(on_disk) == {"tag", "data_dir", "hot_dir", "pid", "started_at", "uid_base"}
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
