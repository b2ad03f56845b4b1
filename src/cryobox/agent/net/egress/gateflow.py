"""What the egress gate (:mod:`.gate`) works with: the queue and conntrack it is given (protocols, so tests can
fake the kernel), and the state it keeps per connection."""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .conntrack import CtEvent, FlowKey
from .nfqueue import QueuedPacket

ENDED_STATES = frozenset({7, 8})
"""conntrack's TCP states TIME_WAIT and CLOSE: the connection is over (both ends closed, or reset)."""
MAX_DENIED = 1024
STALE_S = 120.0
"""An undecided connection nothing was heard of for this long is forgotten (its next packet is judged by address)."""


class Queue(Protocol):
    def fileno(self) -> int: ...

    def read(self) -> list[QueuedPacket]: ...

    def verdict(
        self, packet_id: int, verdict: int, *, mark: int | None = None, packet: bytes | None = None
    ) -> None: ...

    def close(self) -> None: ...


class Tracker(Protocol):
    def event_fileno(self) -> int: ...

    def read_events(self) -> list[CtEvent]: ...

    def set_mark(self, key: FlowKey, mark: int) -> bool: ...

    def counters(self, key: FlowKey) -> tuple[int, int] | None: ...

    def dump(self) -> list[CtEvent]: ...

    def delete(self, key: FlowKey) -> bool: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class Flow:
    key: FlowKey
    ip: ipaddress.IPv4Address
    port: int
    started: float  # wall clock, for the log
    opened: float  # monotonic
    state: Literal["pending", "allowed"] = "pending"
    name: str | None = None  # the name it carried (logged)
    judged_as: str | None = None  # the name its verdict relied on (None: its address)
    reason: str = ""
    next_seq: int | None = None
    head: bytearray = field(default_factory=bytearray)
    held: list[int] = field(default_factory=list)
    replies: list[tuple[int, bytes]] = field(default_factory=list)  # what the server sent before the decision
    judging: bool = False
    timer: asyncio.TimerHandle | None = None
    inherited: bool = False  # allowed by an earlier agent process


__all__ = ["ENDED_STATES", "MAX_DENIED", "STALE_S", "Flow", "Queue", "Tracker"]
