"""Per-workspace request rate limiting with token buckets.

Each workspace has a bucket of ``burst`` tokens refilled at ``rate_per_s``; a request costs one token (or
``cost``). An empty bucket refuses with :class:`RateLimitExceeded` (a :class:`~cryobox.errors.QuotaExceeded`,
HTTP 429) carrying ``retry_after_s``. A rate of 0 disables limiting. Buckets idle long enough to be full again
are forgotten, so memory stays bounded by the number of recently active workspaces.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ...errors import InvalidArgument, QuotaExceeded

ENV_RATE_PER_S = "CRYOBOX_RATE_LIMIT_PER_S"
ENV_BURST = "CRYOBOX_RATE_LIMIT_BURST"

IDLE_FORGET_S = 600.0  # forget buckets idle for longer than this (and full again)
SWEEP_INTERVAL_S = 60.0  # look for idle buckets at most this often


class RateLimitExceeded(QuotaExceeded):
    """A workspace ran out of request tokens; retry after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class RateLimitConfig:
    rate_per_s: float = 50.0  # CRYOBOX_RATE_LIMIT_PER_S; 0 disables
    burst: int = 100  # CRYOBOX_RATE_LIMIT_BURST

    def __post_init__(self) -> None:
        if isinstance(self.rate_per_s, bool) or not isinstance(self.rate_per_s, int | float):
            raise InvalidArgument(f"rate limit must be a number, got {self.rate_per_s!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int):
            raise InvalidArgument(f"rate limit burst must be an integer, got {self.burst!r}")
        if not math.isfinite(self.rate_per_s) or self.rate_per_s < 0:
            raise InvalidArgument(f"rate limit must be a finite number >= 0 per second, got {self.rate_per_s}")
        if self.burst < 1:
            raise InvalidArgument(f"rate limit burst must be >= 1, got {self.burst}")

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RateLimitConfig:
        """Read the ``CRYOBOX_RATE_LIMIT_*`` variables; ``overrides`` (CLI flags) win when not ``None``."""
        env = os.environ if env is None else env
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown rate limit setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        raw = env.get(ENV_RATE_PER_S)
        if raw is not None and raw.strip():
            try:
                values["rate_per_s"] = float(raw.strip())
            except ValueError:
                raise InvalidArgument(f"{ENV_RATE_PER_S} must be a number, got {raw!r}") from None
        raw = env.get(ENV_BURST)
        if raw is not None and raw.strip():
            try:
                values["burst"] = int(raw.strip())
            except ValueError:
                raise InvalidArgument(f"{ENV_BURST} must be an integer, got {raw!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class _Bucket:
    __slots__ = ("tokens", "updated_at")

    def __init__(self, tokens: float, updated_at: float) -> None:
        self.tokens = tokens
        self.updated_at = updated_at


class RateLimiter:
    """Token buckets keyed by workspace id. Not thread-safe: use from one event loop (``check`` never awaits)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        idle_forget_s: float = IDLE_FORGET_S,
    ) -> None:
        config = RateLimitConfig(rate_per_s=rate_per_s, burst=burst)  # validates
        self._rate = float(config.rate_per_s)
        self._burst = config.burst
        self._clock = clock
        # A bucket is only forgotten once it would have refilled completely, so forgetting never grants extra.
        self._forget_after_s = max(idle_forget_s, self._burst / self._rate) if self._rate > 0 else idle_forget_s
        self._buckets: dict[str, _Bucket] = {}
        self._last_sweep = clock()

    @classmethod
    def from_config(cls, config: RateLimitConfig, clock: Callable[[], float] = time.monotonic) -> RateLimiter:
        return cls(config.rate_per_s, config.burst, clock)

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    @property
    def tracked_workspaces(self) -> int:
        """How many buckets are held in memory."""
        return len(self._buckets)

    def check(self, workspace_id: str, cost: float = 1.0) -> None:
        """Spend ``cost`` tokens of ``workspace_id``'s bucket or raise :class:`RateLimitExceeded`."""
        if self._rate <= 0:
            return
        if not math.isfinite(cost) or cost < 0:
            raise InvalidArgument(f"rate limit cost must be a finite number >= 0, got {cost}")
        if cost > self._burst:
            raise InvalidArgument(f"request cost {cost} exceeds the rate limit burst {self._burst}")
        now = self._clock()
        self._maybe_sweep(now)
        bucket = self._buckets.get(workspace_id)
        if bucket is None:
            bucket = self._buckets[workspace_id] = _Bucket(float(self._burst), now)
        else:
            elapsed = max(0.0, now - bucket.updated_at)
            bucket.tokens = min(float(self._burst), bucket.tokens + elapsed * self._rate)
            bucket.updated_at = now
        if bucket.tokens >= cost:
            bucket.tokens -= cost
            return
        wait_s = (cost - bucket.tokens) / self._rate
        retry_after = max(1, math.ceil(wait_s))
        raise RateLimitExceeded(
            f"rate limit exceeded ({self._rate:g} requests/s, burst {self._burst}); retry in {retry_after}s",
            retry_after_s=retry_after,
            details={"retry_after_s": retry_after, "rate_per_s": self._rate, "burst": self._burst},
        )

    def _maybe_sweep(self, now: float) -> None:
        if now - self._last_sweep < SWEEP_INTERVAL_S:
            return
        self._last_sweep = now
        cutoff = now - self._forget_after_s
        stale = [key for key, bucket in self._buckets.items() if bucket.updated_at < cutoff]
        for key in stale:
            del self._buckets[key]
