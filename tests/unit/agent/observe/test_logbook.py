"""A sandbox's log: pages forward and backward by offset with E2B's and /v1's filters (time, level, substring),
offsets that keep their meaning while old lines are dropped, long lines cut, byte bounds that hold."""

from __future__ import annotations

from cryobox.agent.observe.logbook import MAX_LINE_CHARS, LogBook
from cryobox.agent.observe.rings import RingBounds
from cryobox.agentapi.models_obs import LogQuery

T0 = 1_700_000_000.0


def book_with(lines: int, bounds: RingBounds | None = None) -> LogBook:
    book = LogBook(bounds or RingBounds(1000, 1 << 20, 1 << 20))
    for i in range(lines):
        book.add("sb", T0 + i, "warn" if i % 3 == 0 else "info", "console" if i % 2 else "agent", f"line {i}")
    return book


def messages(book: LogBook, **query: object) -> list[str]:
    return [e.message for e in book.page("sb", LogQuery.model_validate(query)).entries]


def test_forward_pages_continue_from_next_offset_until_the_end() -> None:
    book = book_with(5)
    first = book.page("sb", LogQuery(limit=2))
    assert [e.message for e in first.entries] == ["line 0", "line 1"] and first.next_offset == 2
    second = book.page("sb", LogQuery(limit=2, offset=first.next_offset))
    third = book.page("sb", LogQuery(limit=2, offset=second.next_offset))
    assert [e.offset for e in second.entries + third.entries] == [2, 3, 4]
    assert third.next_offset == 5
    later = book.page("sb", LogQuery(offset=5))
    assert later.entries == [] and later.next_offset == 5
    book.add("sb", T0 + 9, "info", "console", "new")
    assert messages(book, offset=5) == ["new"]


def test_backward_pages_go_newest_first() -> None:
    book = book_with(5)
    newest = book.page("sb", LogQuery(limit=2, direction="backward"))
    assert [e.offset for e in newest.entries] == [4, 3] and newest.next_offset == 3
    older = book.page("sb", LogQuery(limit=2, direction="backward", offset=newest.next_offset))
    assert [e.offset for e in older.entries] == [2, 1]
    rest = book.page("sb", LogQuery(limit=2, direction="backward", offset=older.next_offset))
    assert [e.offset for e in rest.entries] == [0]


def test_filters_level_substring_and_time_in_ms() -> None:
    book = book_with(7)
    assert messages(book, level="warn") == ["line 0", "line 3", "line 6"]
    assert messages(book, level="error") == []
    assert messages(book, search="ne 5") == ["line 5"]
    assert messages(book, start_ms=int((T0 + 4) * 1000)) == ["line 4", "line 5", "line 6"]
    assert messages(book, direction="backward", end_ms=int((T0 + 1) * 1000)) == ["line 1", "line 0"]
    entry = book.page("sb", LogQuery(limit=1)).entries[0]
    assert (entry.source, entry.level, entry.timestamp) == ("agent", "warn", T0)


def test_dropped_lines_keep_offsets_and_are_counted() -> None:
    book = book_with(10, RingBounds(4, 1 << 20, 1 << 20))
    page = book.page("sb", LogQuery(offset=0))
    assert page.dropped == 6 and [e.offset for e in page.entries] == [6, 7, 8, 9]
    assert book.page("other", LogQuery()).entries == []


def test_long_lines_are_cut_and_bytes_bounded() -> None:
    book = LogBook(RingBounds(1000, 10_000, 10_000))
    book.add("sb", T0, "info", "console", "x" * (MAX_LINE_CHARS * 3))
    [entry] = book.page("sb", LogQuery()).entries
    assert len(entry.message) == MAX_LINE_CHARS and entry.message.endswith("…")
    for i in range(100):
        book.add("sb", T0, "info", "console", f"{i:04d}" + "y" * 500)
    assert book.total_bytes <= 10_000
    kept = book.page("sb", LogQuery(limit=1000)).entries
    assert kept[-1].message.startswith("0099") and len(kept) < 20
    assert book.keep_only([]) == ["sb"] and book.total_bytes == 0
