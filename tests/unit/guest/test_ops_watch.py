"""Directory watches (inotify) in-process: the agent serves one end of a socketpair, the test drives the other."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.guest import ops_watch
from cryobox.guest.agent import GuestAgent
from tests.support.guest import Harness, Mux

Change = tuple[str, str]


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(GuestAgent(clock_setter=lambda ns: None))
    yield h
    h.agent.watchers.close_all()
    h.close()


@pytest.fixture
def mux(harness: Harness) -> Mux:
    return Mux(harness.client)


class Watch:
    """A ``watch_dir`` stream in flight."""

    def __init__(self, mux: Mux, path: Path, recursive: bool) -> None:
        self.mux = mux
        self.req = mux.send("watch_dir", {"path": str(path), "recursive": recursive})
        events = mux.wait_events(self.req, lambda evs: len(evs) >= 1)
        assert events[0] == ("start", b"")

    def changes(self) -> list[Change]:
        out = []
        for event, data in self.mux.events(self.req)[1:]:
            assert event == "fs"
            change = json.loads(data)
            assert set(change) == {"kind", "name"}
            out.append((change["kind"], change["name"]))
        return out

    def wait(self, change: Change) -> list[Change]:
        self.mux.wait_events(self.req, lambda evs: change in self.changes())
        return self.changes()

    def cancel(self) -> dict[str, Any]:
        assert self.mux.ok("cancel", {"request": self.req}) == {"cancelled": True}
        return self.mux.final(self.req)


def in_order(changes: list[Change], expected: list[Change]) -> bool:
    """``expected`` is a subsequence of ``changes``."""
    it = iter(changes)
    return all(any(c == e for c in it) for e in expected)


def inotify_fds() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify"
        except OSError:
            pass
    return count


def test_recursive_watch_sees_nested_create_write_remove(mux: Mux, tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    watch = Watch(mux, tmp_path, recursive=True)
    (tmp_path / "sub" / "deeper").mkdir(parents=True)  # a new tree: watched as soon as it appears
    # once its create is reported the new directory is watched (a file made and removed before that is not seen)
    watch.wait(("create", "sub/deeper"))
    nested = tmp_path / "sub" / "deeper" / "file.txt"
    nested.write_bytes(b"hello")
    watch.wait(("write", "sub/deeper/file.txt"))
    nested.unlink()
    (tmp_path / "old" / "x").write_bytes(b"1")  # a directory that existed before the watch
    changes = watch.wait(("write", "old/x"))
    nested_changes = [("create", "sub/deeper/file.txt"), ("write", "sub/deeper/file.txt")]
    expected = [("create", "sub"), ("create", "sub/deeper"), *nested_changes, ("remove", "sub/deeper/file.txt")]
    assert in_order(changes, expected)
    assert in_order(changes, [("create", "old/x"), ("write", "old/x")])
    assert watch.cancel()["result"] == {}


def test_write_chmod_rename_and_non_recursive(mux: Mux, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_bytes(b"")
    watch = Watch(mux, tmp_path, recursive=False)
    (tmp_path / "sub" / "hidden.txt").write_bytes(b"not reported")
    with open(tmp_path / "a.txt", "ab") as handle:
        handle.write(b"x")
    (tmp_path / "a.txt").chmod(0o600)
    (tmp_path / "a.txt").rename(tmp_path / "b.txt")
    changes = watch.wait(("create", "b.txt"))
    assert in_order(changes, [("write", "a.txt"), ("chmod", "a.txt"), ("rename", "a.txt"), ("create", "b.txt")])
    assert not any(name.startswith("sub/") for _, name in changes)
    watch.cancel()


def test_moved_directory_is_watched_under_its_new_name(mux: Mux, tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    watch = Watch(mux, tmp_path, recursive=True)
    (tmp_path / "one").rename(tmp_path / "two")
    watch.wait(("create", "two"))
    (tmp_path / "two" / "f").write_bytes(b"")
    changes = watch.wait(("create", "two/f"))
    assert in_order(changes, [("rename", "one"), ("create", "two"), ("create", "two/f")])
    assert ("create", "one/f") not in changes
    watch.cancel()


def test_removing_the_watched_directory_ends_the_stream(mux: Mux, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_bytes(b"")
    watch = Watch(mux, root, recursive=True)
    shutil.rmtree(root)
    final = mux.final(watch.req)
    assert final["result"] == {"ended": "removed"}
    assert in_order(watch.changes(), [("remove", "sub/f"), ("remove", "sub")])


def test_watch_errors(mux: Mux, tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    assert mux.code("watch_dir", {"path": str(tmp_path / "missing")}) == "not_found"
    assert mux.code("watch_dir", {"path": str(tmp_path / "file")}) == "not_a_directory"
    assert mux.code("watch_dir", {"path": "relative"}) == "invalid_argument"
    assert mux.code("watch_create", {"path": str(tmp_path / "missing")}) == "not_found"
    assert mux.code("watch_events", {"watcher": "w-nope"}) == "not_found"
    assert mux.code("watch_remove", {"watcher": "w-nope"}) == "not_found"
    assert mux.code("watch_events", {}) == "invalid_argument"


def test_closing_the_connection_ends_its_watches(harness: Harness, tmp_path: Path) -> None:
    before = inotify_fds()
    Watch(Mux(harness.client), tmp_path, recursive=False)
    assert inotify_fds() == before + 1
    harness.client.sock.close()
    deadline = time.monotonic() + 5
    while inotify_fds() > before:
        assert time.monotonic() < deadline, "watch_dir kept running after its connection closed"
        time.sleep(0.02)


def poll_events(mux: Mux, watcher: str, until: Callable[[list[Change]], bool]) -> list[Change]:
    seen: list[Change] = []
    deadline = time.monotonic() + 10
    while not until(seen):
        assert time.monotonic() < deadline, seen
        reply = mux.ok("watch_events", {"watcher": watcher})
        seen += [(e["kind"], e["name"]) for e in reply["events"]]
        time.sleep(0.02)
    return seen


def test_watcher_trio(mux: Mux, tmp_path: Path) -> None:
    watcher = mux.ok("watch_create", {"path": str(tmp_path), "recursive": True})["watcher"]
    (tmp_path / "d").mkdir()
    poll_events(mux, watcher, lambda s: ("create", "d") in s)
    (tmp_path / "d" / "n.txt").write_bytes(b"data")
    (tmp_path / "d" / "n.txt").unlink()
    seen = poll_events(mux, watcher, lambda s: ("remove", "d/n.txt") in s)
    assert in_order(seen, [("create", "d/n.txt"), ("write", "d/n.txt"), ("remove", "d/n.txt")])
    assert mux.ok("watch_events", {"watcher": watcher}) == {"events": [], "dropped": 0, "ended": None}  # drained
    assert mux.ok("watch_remove", {"watcher": watcher}) == {}
    assert mux.code("watch_events", {"watcher": watcher}) == "not_found"


def test_watcher_buffer_is_bounded_and_end_is_reported(
    mux: Mux, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops_watch, "MAX_EVENTS", 5)
    root = tmp_path / "root"
    root.mkdir()
    watcher = mux.ok("watch_create", {"path": str(root)})["watcher"]
    for i in range(20):
        (root / f"f{i}").write_bytes(b"")
    shutil.rmtree(root)
    deadline = time.monotonic() + 10
    while (reply := mux.ok("watch_events", {"watcher": watcher}))["ended"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert len(reply["events"]) == 5 and reply["dropped"] > 0
    assert reply["events"][-1]["kind"] == "remove"  # the newest are kept


def test_watcher_limit(mux: Mux, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_watch, "MAX_WATCHERS", 2)
    first = mux.ok("watch_create", {"path": str(tmp_path)})["watcher"]
    mux.ok("watch_create", {"path": str(tmp_path)})
    assert mux.code("watch_create", {"path": str(tmp_path)}) == "invalid_argument"
    mux.ok("watch_remove", {"watcher": first})
    mux.ok("watch_create", {"path": str(tmp_path)})
