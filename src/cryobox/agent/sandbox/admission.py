"""Admission control for restores: a bounded FIFO queue in front of a fixed number of restore slots.

A request that finds a free slot and nobody queued enters at once. Otherwise it joins the queue, unless the
queue is full, in which case it is refused straight away with :class:`~cryobox.errors.HostUnavailable` (HTTP 503)
and a ``Retry-After`` estimated from recent restore durations. A queued request waits at most ``timeout_s``;
past that it leaves the queue and is refused the same way.

Releasing a slot hands it directly to the oldest waiter, so a newcomer can never overtake the queue. A waiter
that is cancelled (its client went away) leaves the queue cleanly; if it had just been handed a slot it passes
the slot on, so no slot is ever leaked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any, Protocol

from ...errors import HostUnavailable, InvalidArgument

log = logging.getLogger(__name__)

ENV_MAX_CONCURRENT = "CRYOBOX_MAX_CONCURRENT_RESTORES"
ENV_QUEUE_LENGTH = "CRYOBOX_ADMISSION_QUEUE"
ENV_TIMEOUT_S = "CRYOBOX_ADMISSION_TIMEOUT_S"

RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 30
# Restore-duration estimate used for Retry-After before any restore has finished.
DEFAULT_DURATION_ESTIMATE_S = 1.0
# Weight of the newest sample in the restore-duration EWMA.
EWMA_ALPHA = 0.2


class AdmissionObserver(Protocol):
    """Receives admission events (for metrics). Must not block; exceptions are logged and ignored."""

    def on_wait(self, seconds: float, admitted: bool) -> None: ...

    def on_queue_depth(self, depth: int) -> None: ...


@dataclass(frozen=True)
class AdmissionConfig:
    max_concurrent: int = 4  # CRYOBOX_MAX_CONCURRENT_RESTORES
    queue_length: int = 64  # CRYOBOX_ADMISSION_QUEUE: waiters beyond the running ones
    timeout_s: float = 30.0  # CRYOBOX_ADMISSION_TIMEOUT_S: longest wait in the queue

    def __post_init__(self) -> None:
        if isinstance(self.max_concurrent, bool) or not isinstance(self.max_concurrent, int):
            raise InvalidArgument(f"max_concurrent must be an integer, got {self.max_concurrent!r}")
        if isinstance(self.queue_length, bool) or not isinstance(self.queue_length, int):
            raise InvalidArgument(f"queue_length must be an integer, got {self.queue_length!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float):
            raise InvalidArgument(f"timeout_s must be a number, got {self.timeout_s!r}")
        if self.max_concurrent <= 0:
            raise InvalidArgument(f"max concurrent restores must be > 0, got {self.max_concurrent}")
        if self.queue_length < 0:
            raise InvalidArgument(f"admission queue length must be >= 0, got {self.queue_length}")
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise InvalidArgument(f"admission timeout must be a finite number of seconds > 0, got {self.timeout_s}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AdmissionConfig:
        """Read the ``CRYOBOX_*`` variables; ``overrides`` (CLI flags) win when not ``None``."""
        env = os.environ if env is None else env
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown admission setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        raw = env.get(ENV_MAX_CONCURRENT)
        if raw is not None and raw.strip():
            values["max_concurrent"] = _parse_int(ENV_MAX_CONCURRENT, raw)
        raw = env.get(ENV_QUEUE_LENGTH)
        if raw is not None and raw.strip():
            values["queue_length"] = _parse_int(ENV_QUEUE_LENGTH, raw)
        raw = env.get(ENV_TIMEOUT_S)
        if raw is not None and raw.strip():
            values["timeout_s"] = _parse_float(ENV_TIMEOUT_S, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {raw!r}") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise InvalidArgument(f"{name} must be a number, got {raw!r}") from None


class AdmissionController:
    """Bounds concurrent restores; use as ``async with controller.slot(): ...``.

    Not thread-safe: use from one event loop.
    """

    def __init__(
        self,
        config: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
        observer: AdmissionObserver | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._observer = observer
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._ewma_s: float | None = None

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def queue_depth(self) -> int:
        return len(self._waiters)

    @property
    def running(self) -> int:
        return self._running

    @property
    def duration_estimate_s(self) -> float:
        """EWMA of recent slot hold times (restore durations), or a default before the first one."""
        return DEFAULT_DURATION_ESTIMATE_S if self._ewma_s is None else self._ewma_s

    def retry_after_s(self, ahead: int | None = None) -> int:
        """Seconds a client should wait before retrying with ``ahead`` requests in front of it (default: the queue)."""
        if ahead is None:
            ahead = len(self._waiters)
        estimate = math.ceil(ahead * self.duration_estimate_s / self._config.max_concurrent)
        return max(RETRY_AFTER_MIN_S, min(RETRY_AFTER_MAX_S, estimate))

    def slot(self) -> AbstractAsyncContextManager[None]:
        return _Slot(self)

    # -- internals ---------------------------------------------------------------------------------------

    async def _acquire(self) -> float:
        """Take a slot (possibly after queueing); return the admission time on ``self._clock``."""
        if self._running < self._config.max_concurrent and not self._waiters:
            self._running += 1
            self._notify_wait(0.0, True)
            return self._clock()

        if len(self._waiters) >= self._config.queue_length:
            self._notify_wait(0.0, False)
            raise HostUnavailable(
                "admission queue full",
                retry_after_s=self.retry_after_s(len(self._waiters)),
                details={"queue_depth": len(self._waiters), "max_concurrent": self._config.max_concurrent},
            )

        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._notify_depth()
        started = self._clock()
        try:
            async with asyncio.timeout(self._config.timeout_s):
                await fut
        except TimeoutError:
            waited = self._clock() - started
            if fut.done() and not fut.cancelled():
                # The slot was handed over in the same instant the deadline passed: keep it.
                self._notify_wait(waited, True)
                return self._clock()
            self._leave_queue(fut)
            self._notify_wait(waited, False)
            raise HostUnavailable(
                f"waited {waited:.1f}s for a restore slot",
                retry_after_s=self.retry_after_s(),
                details={"waited_s": round(waited, 3), "queue_depth": len(self._waiters)},
            ) from None
        except BaseException:
            # Cancelled (client went away) or something unexpected: never keep or leak a slot.
            if fut.done() and not fut.cancelled():
                self._release()  # we were handed a slot but will not use it: pass it on
            else:
                self._leave_queue(fut)
            self._notify_wait(self._clock() - started, False)
            raise
        self._notify_wait(self._clock() - started, True)
        return self._clock()

    def _leave_queue(self, fut: asyncio.Future[None]) -> None:
        try:
            self._waiters.remove(fut)
        except ValueError:
            pass
        else:
            self._notify_depth()
        fut.cancel()

    def _release(self) -> None:
        """Hand the slot to the oldest live waiter, or free it."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # ``running`` is unchanged: the slot moves to that waiter
                self._notify_depth()
                return
        self._running -= 1
        self._notify_depth()

    def _record_duration(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self._ewma_s is None:
            self._ewma_s = seconds
        else:
            self._ewma_s = EWMA_ALPHA * seconds + (1 - EWMA_ALPHA) * self._ewma_s

    def _notify_wait(self, seconds: float, admitted: bool) -> None:
        if self._observer is None:
            return
        try:
            self._observer.on_wait(max(0.0, seconds), admitted)
        except Exception:
            log.exception("admission observer failed")

    def _notify_depth(self) -> None:
        if self._observer is None:
            return
        try:
            self._observer.on_queue_depth(len(self._waiters))
        except Exception:
            log.exception("admission observer failed")


class _Slot(AbstractAsyncContextManager[None]):
    __slots__ = ("_controller", "_admitted_at")

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller
        self._admitted_at: float | None = None

    async def __aenter__(self) -> None:
        if self._admitted_at is not None:
            raise RuntimeError("an admission slot context cannot be entered twice")
        self._admitted_at = await self._controller._acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        admitted_at, self._admitted_at = self._admitted_at, None
        if admitted_at is None:
            return
        controller = self._controller
        controller._record_duration(controller._clock() - admitted_at)
        controller._release()
