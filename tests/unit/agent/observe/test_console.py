"""Following a console file as a hostile guest writes it: whole lines only, what was not read yet and no more,
a bounded read per round (the excess skipped and counted), a file cut under the reader, escapes removed."""

from __future__ import annotations

from pathlib import Path

from cryobox.agent.observe.console import MAX_PARTIAL, ConsoleCursor, clean, read_new


def test_lines_as_they_complete(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"boot\nhalf")
    cursor = ConsoleCursor(log)
    assert read_new(cursor, 1024).lines == ["boot"]
    assert read_new(cursor, 1024).lines == []
    with open(log, "ab") as out:
        out.write(b" done\r\n\n\x1b[31mred\x1b[0m\tand\x07 bell\n")
    assert read_new(cursor, 1024).lines == ["half done", "red\tand bell"]


def test_a_missing_file_is_nothing(tmp_path: Path) -> None:
    assert read_new(ConsoleCursor(tmp_path / "none.log"), 1024).lines == []


def test_the_first_read_takes_only_the_tail_and_a_flood_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"".join(b"old %04d\n" % i for i in range(1000)))  # 9000 bytes
    cursor = ConsoleCursor(log)
    first = read_new(cursor, 90)
    assert first.skipped == 0 and first.lines[-1] == "old 0999" and len(first.lines) <= 10
    with open(log, "ab") as out:
        out.write(b"".join(b"new %04d\n" % i for i in range(100)))
    flood = read_new(cursor, 90)
    assert flood.skipped == 900 - 90 and flood.lines == [f"new {i:04d}" for i in range(90, 100)]


def test_a_file_cut_under_the_reader_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"one\ntwo\n")
    cursor = ConsoleCursor(log)
    read_new(cursor, 1024)
    log.write_bytes(b"3\n")  # rotated: cut to nothing, then written
    again = read_new(cursor, 1024)
    assert again.restarted and again.lines == ["3"]


def test_a_line_without_end_is_cut(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"x" * (MAX_PARTIAL + 10))
    cursor = ConsoleCursor(log)
    assert read_new(cursor, 1 << 20).lines == ["x" * (MAX_PARTIAL + 10)]
    assert cursor.partial == b""


def test_clean() -> None:
    assert clean(b"\x1b[2J\x1b[Hprompt$ \xff\r") == "prompt$ \ufffd"
