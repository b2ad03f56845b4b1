"""A store-side latency / bandwidth / throttle injector: ``FaultyStore`` wraps any ``ObjectStore``.

Faults apply to GETs (``get``, ``get_range``, ``download``); every other operation passes straight through. A
GET waits for a slot (``max_concurrent``; the excess queues), waits ``latency_ms`` (time to first byte), may be
answered ``StoreThrottled`` (``throttle_rate``) or ``StoreError`` (``fail_rate``) instead, and otherwise takes as
long as its bytes need on a link of ``bandwidth_mbps`` megabits/s shared fairly by every GET transferring at the
same time (processor sharing, see ``SharedLink``). The platform reads the spec from ``CRYOBOX_STORE_FAULTS``::

    CRYOBOX_STORE_FAULTS="latency_ms=20,bandwidth_mbps=400,throttle_rate=0.05"
"""

from __future__ import annotations

import builtins
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import InvalidArgument, StoreError, StoreThrottled
from .client import ObjectMeta, ObjectStore, StoreStats, Verify

ENV_VAR = "CRYOBOX_STORE_FAULTS"
_DONE_BYTES = 1e-3  # a flow this close to its target is finished (float rounding of clock differences)
_DONE_SECONDS = 1e-6


@dataclass(frozen=True)
class StoreFaults:
    latency_ms: float = 0
    bandwidth_mbps: float = 0  # megabits/s shared by all concurrent GETs; 0 = unlimited
    max_concurrent: int = 0  # GETs in flight at once; 0 = unlimited, the excess queues
    throttle_rate: float = 0  # fraction of GETs answered StoreThrottled
    fail_rate: float = 0  # fraction of GETs answered StoreError

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"store fault {f.name} must be a finite number >= 0, not {value!r}")
        if not isinstance(self.max_concurrent, int):
            raise InvalidArgument(f"store fault max_concurrent must be an integer, not {self.max_concurrent!r}")
        if self.throttle_rate + self.fail_rate > 1:
            raise InvalidArgument("store fault throttle_rate + fail_rate must be <= 1")

    @property
    def enabled(self) -> bool:
        return self != StoreFaults()

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_mbps * 1e6 / 8

    @classmethod
    def parse(cls, text: str) -> StoreFaults:
        """``"latency_ms=20,bandwidth_mbps=400"`` -> StoreFaults; ``""`` -> no faults; bad text -> InvalidArgument."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, float | int] = {}
        for item in text.split(","):
            if not item.strip():
                continue
            name, sep, raw = (part.strip() for part in item.partition("="))
            if not sep or name not in known:
                raise InvalidArgument(f"bad store fault {item.strip()!r} (known: {', '.join(known)})")
            if name in values:
                raise InvalidArgument(f"store fault {name} given twice")
            try:
                values[name] = int(raw) if name == "max_concurrent" else float(raw)
            except ValueError:
                raise InvalidArgument(f"store fault {name} needs a number, not {raw!r}") from None
        return cls(**values)  # type: ignore[arg-type]  # names checked against the fields above

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StoreFaults:
        return cls.parse(env.get(ENV_VAR, ""))

    def to_spec(self) -> str:
        """The text ``parse`` reads back into an equal value; only fields that differ from the defaults."""
        default = StoreFaults()
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                parts.append(f"{f.name}={_number(value)}")
        return ",".join(parts)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class SharedLink:
    """A link of ``rate`` bytes/s shared equally by the flows on it (fluid processor sharing).

    Pure bookkeeping over explicit times, so it is testable without threads: ``start`` a flow, ``advance`` the
    clock, ask ``finished`` / ``eta``. Each active flow receives ``rate / n`` while ``n`` flows are active.
    """

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError("link rate must be > 0")
        self.rate = rate
        self._served = 0.0  # bytes each flow that has been active throughout received ("virtual time")
        self._now: float | None = None
        self._targets: dict[int, float] = {}  # active flow -> value of _served at which it completes
        self._next_id = 0

    @property
    def active(self) -> int:
        return len(self._targets)

    def advance(self, now: float) -> None:
        if self._now is None:
            self._now = now
        if now <= self._now:
            return
        left, self._now = now - self._now, now
        while left > 0 and self._targets:
            n = len(self._targets)
            gap = min(self._targets.values()) - self._served
            needed = gap * n / self.rate
            if needed > left:
                self._served += left * self.rate / n
                break
            self._served += gap
            left -= needed
            self._drop_finished()

    def start(self, nbytes: int, now: float) -> int:
        self.advance(now)
        flow, self._next_id = self._next_id, self._next_id + 1
        self._targets[flow] = self._served + max(nbytes, 0)
        self._drop_finished()
        return flow

    def finished(self, flow: int) -> bool:
        return flow not in self._targets

    def cancel(self, flow: int) -> None:
        self._targets.pop(flow, None)

    def eta(self, flow: int) -> float:
        """Seconds until ``flow`` completes if no other flow arrives (0 when it already has)."""
        if flow not in self._targets:
            return 0.0
        mine = self._targets[flow]
        ahead = sorted(t for t in self._targets.values() if t < mine)
        seconds, served, n = 0.0, self._served, len(self._targets)
        for target in ahead:
            seconds += (target - served) * n / self.rate
            served, n = target, n - 1
        return seconds + (mine - served) * n / self.rate

    def _drop_finished(self) -> None:
        for flow in [f for f, target in self._targets.items() if target - self._served <= _DONE_BYTES]:
            del self._targets[flow]


class FaultyStore:
    """``ObjectStore`` wrapper that injects ``faults`` into GETs. ``stats`` counts what callers saw (injected
    throttles and failures included); ``inner.stats`` counts what reached the real store."""

    def __init__(
        self,
        inner: ObjectStore,
        faults: StoreFaults,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` measures the shared link's time. Left out, it is ``time.monotonic`` with the real sleep,
        and with an injected ``sleep`` a virtual clock that advances by exactly what this store sleeps."""
        self.inner = inner
        self.faults = faults
        self.stats = StoreStats()
        self._sleep = sleep
        self._virtual_now = 0.0
        self._virtual = clock is None and sleep is not time.sleep
        self._clock = clock or (self._virtual_clock if self._virtual else time.monotonic)
        self._rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(faults.max_concurrent) if faults.max_concurrent else None
        self._link = SharedLink(faults.bytes_per_s) if faults.bandwidth_mbps else None

    @property
    def url(self) -> str:
        return self.inner.url

    def _virtual_clock(self) -> float:
        return self._virtual_now

    def _pause(self, seconds: float) -> None:
        self._sleep(seconds)
        if self._virtual:
            with self._lock:
                self._virtual_now += seconds

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r}, {self.faults.to_spec()!r})"

    @contextmanager
    def _faulted_get(self, op: str, key: str) -> Iterator[None]:
        """Slot, latency, maybe an injected error; then the body of the GET runs."""
        self.stats.add(gets=1)
        if self._slots is not None:
            self._slots.acquire()
        try:
            with self._lock:
                draw = self._rng.random()
            if self.faults.latency_ms:
                self._pause(self.faults.latency_ms / 1000)
            injected: StoreError | None = None
            details = {"op": op, "key": key, "store": self.url, "injected": True}
            if draw < self.faults.throttle_rate:
                details["status"] = 503
                injected = StoreThrottled(f"{op} {key!r}: SlowDown (injected by {ENV_VAR})", details=details)
            elif draw < self.faults.throttle_rate + self.faults.fail_rate:
                details["status"] = 500
                injected = StoreError(f"{op} {key!r}: injected store failure ({ENV_VAR})", details=details)
            if injected is not None:
                self.stats.failed(injected)
                raise injected
            try:
                yield
            except StoreError as err:
                self.stats.failed(err)
                raise
        finally:
            if self._slots is not None:
                self._slots.release()

    def _transfer(self, nbytes: int) -> None:
        """Hold the caller for as long as ``nbytes`` take on the shared link."""
        if self._link is None or nbytes <= 0:
            return
        with self._lock:
            flow = self._link.start(nbytes, self._clock())
        try:
            while True:
                with self._lock:
                    self._link.advance(self._clock())
                    wait = self._link.eta(flow)
                if wait <= _DONE_SECONDS:
                    return
                self._pause(wait)
        finally:
            with self._lock:
                self._link.cancel(flow)

    def get(self, key: str) -> bytes:
        with self._faulted_get("get", key):
            data = self.inner.get(key)
            self._transfer(len(data))
        self.stats.add(get_bytes=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._faulted_get("get_range", key):
            data = self.inner.get_range(key, start, length)
            self._transfer(len(data))
        self.stats.add(get_bytes=len(data))
        return data

    def download(self, key: str, dest: Path, verify: Verify | None = None) -> None:
        with self._faulted_get("download", key):
            self.inner.download(key, dest, verify)
            size = dest.stat().st_size
            self._transfer(size)
        self.stats.add(get_bytes=size)

    def head(self, key: str) -> ObjectMeta:
        return self.inner.head(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def probe(self, key: str) -> ObjectMeta | None:
        return self.inner.probe(key)

    def put(self, key: str, data: bytes) -> None:
        self.stats.add(puts=1)
        self.inner.put(key, data)

    def put_file(self, key: str, path: Path) -> None:
        self.stats.add(puts=1)
        self.inner.put_file(key, path)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def list_meta(self, prefix: str) -> builtins.list[ObjectMeta]:
        return self.inner.list_meta(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def with_faults(store: ObjectStore, env: Mapping[str, str]) -> ObjectStore:
    """``store`` wrapped in a ``FaultyStore`` when ``CRYOBOX_STORE_FAULTS`` asks for faults, else ``store``."""
    faults = StoreFaults.from_env(env)
    return FaultyStore(store, faults) if faults.enabled else store
