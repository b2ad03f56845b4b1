"""Exec history (the web console shows it): the last 50 ``POST /v1/sandboxes/{id}/exec`` calls per sandbox on this
replica (a ring per sandbox, the least recently used sandboxes forgotten past 1024), with the tails of their
output."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass
from typing import Any

PER_SANDBOX = 50
MAX_SANDBOXES = 1024
TAIL_CHARS = 4096


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else text[-limit:]


@dataclass(frozen=True)
class ExecRecord:
    command: str
    exit_code: int | None
    started_at: float
    """Unix seconds."""
    duration_ms: float
    stdout_tail: str
    stderr_tail: str
    timed_out: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ExecHistory:
    def __init__(self, per_sandbox: int = PER_SANDBOX, max_sandboxes: int = MAX_SANDBOXES) -> None:
        self._per_sandbox = per_sandbox
        self._max_sandboxes = max_sandboxes
        self._lock = threading.Lock()
        self._rings: OrderedDict[str, deque[ExecRecord]] = OrderedDict()

    def record(self, sandbox_id: str, record: ExecRecord) -> None:
        with self._lock:
            ring = self._rings.get(sandbox_id)
            if ring is None:
                ring = self._rings[sandbox_id] = deque(maxlen=self._per_sandbox)
            ring.append(
                ExecRecord(
                    command=tail(record.command),
                    exit_code=record.exit_code,
                    started_at=record.started_at,
                    duration_ms=record.duration_ms,
                    stdout_tail=tail(record.stdout_tail),
                    stderr_tail=tail(record.stderr_tail),
                    timed_out=record.timed_out,
                )
            )
            self._rings.move_to_end(sandbox_id)
            while len(self._rings) > self._max_sandboxes:
                self._rings.popitem(last=False)

    def list(self, sandbox_id: str) -> list[ExecRecord]:
        """Oldest first."""
        with self._lock:
            return list(self._rings.get(sandbox_id, ()))

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._rings.pop(sandbox_id, None)
