"""Each sandbox's log on this host: its guest console's lines and the agent's own lines about it, with a level and
a time, bounded in lines and bytes per sandbox and in bytes for the host (:mod:`.rings`: a guest spamming its
console loses its own oldest lines, never another sandbox's), read page by page (:meth:`LogBook.page`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ...agentapi.models_obs import LOG_LEVELS, LogEntry, LogLevel, LogPage, LogQuery, LogSource
from .rings import Ring, RingBounds, Rings

MAX_LINE_CHARS = 2048
"""A longer line is cut (the guest may write a line without end)."""
ENTRY_OVERHEAD = 64
"""What an entry weighs besides its message (for the byte bounds)."""


@dataclass(frozen=True, slots=True)
class LogLine:
    timestamp: float
    level: LogLevel
    source: LogSource
    message: str

    @property
    def ms(self) -> int:
        return int(self.timestamp * 1000)


def _weight(line: LogLine) -> int:
    return len(line.message) + ENTRY_OVERHEAD


def clip(message: str) -> str:
    return message if len(message) <= MAX_LINE_CHARS else message[: MAX_LINE_CHARS - 1] + "…"


class LogBook:
    def __init__(self, bounds: RingBounds) -> None:
        self._rings: Rings[LogLine] = Rings(bounds, _weight)

    def add(self, sandbox_id: str, timestamp: float, level: LogLevel, source: LogSource, message: str) -> int:
        """Append a line (cut to :data:`MAX_LINE_CHARS`); returns its offset."""
        return self._rings.add(sandbox_id, LogLine(timestamp, level, source, clip(message)))

    def forget(self, sandbox_id: str) -> None:
        self._rings.forget(sandbox_id)

    def keep_only(self, sandbox_ids: Iterable[str]) -> list[str]:
        return self._rings.keep_only(sandbox_ids)

    @property
    def total_bytes(self) -> int:
        return self._rings.total_weight

    def page(self, sandbox_id: str, query: LogQuery) -> LogPage:
        """The entries ``query`` selects (:class:`~cryobox.agentapi.models_obs.LogQuery`); an unknown sandbox has
        an empty log."""
        ring = self._rings.get(sandbox_id) or Ring()
        forward = query.direction == "forward"
        chosen = list(itertools.islice(_matching(ring, query), query.limit))
        full = query.limit > 0 and len(chosen) == query.limit
        if forward:
            next_offset = chosen[-1][0] + 1 if full else max(ring.end, query.offset or 0)
        else:
            next_offset = chosen[-1][0] if full else ring.first
        entries = [
            LogEntry(offset=o, timestamp=e.timestamp, level=e.level, source=e.source, message=e.message)
            for o, e in chosen
        ]
        return LogPage(entries=entries, next_offset=next_offset, dropped=ring.dropped)


def _matching(ring: Ring[LogLine], query: LogQuery) -> Iterator[tuple[int, LogLine]]:
    least = LOG_LEVELS.index(query.level) if query.level is not None else 0
    if query.direction == "forward":
        skip = max(0, (query.offset or 0) - ring.first)
        numbered: Iterator[tuple[int, LogLine]] = itertools.islice(ring.numbered(), skip, None)
    else:
        numbered = reversed(list(ring.numbered()))
    for offset, line in numbered:
        if query.direction == "backward" and query.offset is not None and offset >= query.offset:
            continue
        if query.start_ms is not None and line.ms < query.start_ms:
            continue
        if query.end_ms is not None and line.ms > query.end_ms:
            continue
        if LOG_LEVELS.index(line.level) < least:
            continue
        if query.search and query.search not in line.message:
            continue
        yield offset, line
