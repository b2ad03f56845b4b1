"""The typed guest answers (``agentapi/models_guest.py``) against what the real guest agent answers: every file-system
op and a directory watch run in-process (the guest's own op functions, on a temporary tree), and the network
inspection on this host. Each answer must validate (a declared field of the wrong type would turn a working call
into ``GuestError``) and serialize back to exactly the guest's JSON."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from cryobox.agentapi.models_guest import FsReply, GuestAnswer, NetInspection
from cryobox.errors import GuestError
from cryobox.guest import ops_files
from cryobox.guest.ops_inspect import NetInspector
from cryobox.guest.ops_watch import WatcherTable


def same_json(model: type[GuestAnswer], raw: dict[str, Any]) -> None:
    typed = model.from_guest(raw)
    assert json.loads(typed.model_dump_json()) == json.loads(json.dumps(raw))


def no_emit(event: str, data: bytes) -> None:
    raise AssertionError("these ops do not stream")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("hello")
    os.symlink(tmp_path / "d" / "a.txt", tmp_path / "d" / "link")
    os.symlink(tmp_path / "missing", tmp_path / "d" / "broken")
    return tmp_path / "d"


def test_every_file_system_answer_is_a_valid_fs_reply(tree: Path) -> None:
    answers = [
        ops_files.op_stat({"path": str(tree / "a.txt")}),
        ops_files.op_stat({"path": str(tree / "link")}),
        ops_files.op_stat({"path": str(tree / "broken")}),
        ops_files.op_list_dir({"path": str(tree), "depth": 2}),
        ops_files.op_mkdir({"path": str(tree / "new")}),
        ops_files.op_mkdir({"path": str(tree / "new")}),  # there already: created false
        ops_files.op_move({"path": str(tree / "new"), "destination": str(tree / "moved")}),
        ops_files.op_delete({"path": str(tree / "moved")}),
    ]
    for raw in answers:
        same_json(FsReply, raw)
    listing = FsReply.from_guest(answers[3])
    assert listing.entries is not None and {e.type for e in listing.entries} == {"file", "dir", "symlink"}
    assert FsReply.from_guest(answers[5]).created is False


def test_watch_answers_validate_while_it_runs_and_once_it_ended(tree: Path) -> None:
    table = WatcherTable()
    try:
        created = table.op_create({"path": str(tree), "recursive": False}, no_emit)
        same_json(FsReply, created)
        args = {"watcher": created["watcher"]}
        (tree / "b.txt").write_text("x")
        deadline = time.monotonic() + 10
        events: list[dict[str, Any]] = []
        while not events:
            assert time.monotonic() < deadline, "the watcher saw no change"
            answer = table.op_events(args, no_emit)
            same_json(FsReply, answer)  # "ended": None while it runs
            events = answer["events"]
            time.sleep(0.02)
        for sub in tree.iterdir():
            if sub.is_dir() and not sub.is_symlink():
                sub.rmdir()
            else:
                sub.unlink()
        tree.rmdir()
        while (answer := table.op_events(args, no_emit))["ended"] is None:
            assert time.monotonic() < deadline, "the watcher did not end with its directory"
            time.sleep(0.02)
        same_json(FsReply, answer)
        assert FsReply.from_guest(answer).ended == "removed"
        same_json(FsReply, table.op_remove(args, no_emit))
    finally:
        table.close_all()


def test_the_network_inspection_of_this_host_is_valid() -> None:
    same_json(NetInspection, NetInspector().inspect())


def test_a_known_key_of_the_wrong_type_is_a_guest_error() -> None:
    with pytest.raises(GuestError, match="not a valid FsReply"):
        FsReply.from_guest({"size": "big"})
