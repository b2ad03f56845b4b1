"""Evidence files beside a snapshot: names validated, atomic writes, listing, missing files."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryobox.agent.snapshot import evidence
from cryobox.errors import InvalidArgument, NotFound, PayloadTooLarge


def test_collect_copies_present_files_and_skips_missing(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("boot\n")
    snap = tmp_path / "snap"
    snap.mkdir()
    evidence.collect(snap, {"console.log": log, "qemu.log": tmp_path / "missing.log"})
    assert evidence.listing(snap) == [{"name": "console.log", "size": 5}]
    assert evidence.read(snap, "console.log") == b"boot\n"


def test_put_read_list(tmp_path: Path) -> None:
    assert evidence.listing(tmp_path) == []
    assert evidence.put(tmp_path, "test.log", b"FAILED x\n") == 9
    assert evidence.put(tmp_path, "test.log", b"again\n") == 6  # replaced whole
    assert evidence.read(tmp_path, "test.log") == b"again\n"
    assert [f["name"] for f in evidence.listing(tmp_path)] == ["test.log"]
    assert not any(p.name.startswith(".") for p in (tmp_path / "evidence").iterdir())


@pytest.mark.parametrize("name", ["", ".hidden", "../escape", "a/b", "x" * 129, "sp ace"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidArgument):
        evidence.put(tmp_path, name, b"")
    with pytest.raises(InvalidArgument):
        evidence.read(tmp_path, name)


def test_missing_file_and_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotFound):
        evidence.read(tmp_path, "nope.log")
    monkeypatch.setattr(evidence, "MAX_BYTES", 4)
    with pytest.raises(PayloadTooLarge):
        evidence.put(tmp_path, "big.log", b"12345")
