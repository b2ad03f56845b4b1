"""Counters of one object store (what it was asked, what it answered), shared by every ``ObjectStore``."""

from __future__ import annotations

import threading

from ..errors import StoreError, StoreThrottled


class StoreStats:
    """Thread-safe counters of one store: ``gets`` (GET calls that reached the store: get, get_range, download),
    ``get_bytes`` (bytes those returned), ``puts``, ``errors`` (failed calls of any kind) and ``throttled``."""

    FIELDS = ("gets", "get_bytes", "puts", "errors", "throttled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, **counts: int) -> None:
        unknown = set(counts) - set(self.FIELDS)
        if unknown:
            raise ValueError(f"unknown store counters: {sorted(unknown)}")
        with self._lock:
            for name, value in counts.items():
                self._counts[name] += value

    def failed(self, err: StoreError) -> None:
        self.add(errors=1, throttled=int(isinstance(err, StoreThrottled)))

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def gets(self) -> int:
        return self.snapshot()["gets"]

    @property
    def get_bytes(self) -> int:
        return self.snapshot()["get_bytes"]

    @property
    def puts(self) -> int:
        return self.snapshot()["puts"]

    @property
    def errors(self) -> int:
        return self.snapshot()["errors"]

    @property
    def throttled(self) -> int:
        return self.snapshot()["throttled"]
