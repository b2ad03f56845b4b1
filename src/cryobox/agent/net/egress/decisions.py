"""What the egress proxy decided, per sandbox: a bounded log (the newest :data:`LOG_SIZE` entries; older ones
are counted as dropped) and an observer that turns every decision into Prometheus counters.

An entry is written when a denied connection is refused, and when an allowed one ends (with the bytes it moved
each way); a DNS query for a name the policy does not let resolve is an entry too (port 53, no address)."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Protocol

from ....agentapi.models import EgressDecision, EgressLog

LOG_SIZE = 1000


class DecisionObserver(Protocol):
    def on_decision(self, allowed: bool, reason: str) -> None: ...

    def on_bytes(self, sent: int, received: int) -> None: ...


class NoObserver:
    def on_decision(self, allowed: bool, reason: str) -> None:
        pass

    def on_bytes(self, sent: int, received: int) -> None:
        pass


@dataclass
class DecisionLog:
    """The newest ``size`` decisions of one sandbox, oldest first."""

    size: int = LOG_SIZE

    def __post_init__(self) -> None:
        self._entries: collections.deque[EgressDecision] = collections.deque(maxlen=self.size)
        self.dropped = 0

    def add(self, entry: EgressDecision) -> None:
        if len(self._entries) == self.size:
            self.dropped += 1
        self._entries.append(entry)

    def read(self, limit: int | None = None) -> EgressLog:
        items = list(self._entries)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return EgressLog(items=items, dropped=self.dropped)


__all__ = ["LOG_SIZE", "DecisionLog", "DecisionObserver", "NoObserver"]
