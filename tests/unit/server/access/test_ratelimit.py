"""Per-workspace token buckets, driven by a fake clock."""

from __future__ import annotations

import pytest

from cryobox.errors import InvalidArgument, QuotaExceeded
from cryobox.server.access.ratelimit import RateLimitConfig, RateLimiter, RateLimitExceeded
from tests.support.clock import FakeClock


def drain(limiter: RateLimiter, workspace: str, n: int) -> None:
    for _ in range(n):
        limiter.check(workspace)


def test_burst_then_refusal_with_retry_after() -> None:
    clock = FakeClock(500.0)
    limiter = RateLimiter(rate_per_s=0.5, burst=3, clock=clock)
    drain(limiter, "ws", 3)
    with pytest.raises(RateLimitExceeded) as info:
        limiter.check("ws")
    assert isinstance(info.value, QuotaExceeded)
    assert info.value.http_status == 429
    assert info.value.code == "rate_limited"
    assert info.value.retry_after_s == 2  # one token at 0.5/s
    assert info.value.details["retry_after_s"] == 2

    clock.now += 1.5  # 0.75 tokens: still short by 0.25 -> 0.5 s, rounded up to 1
    with pytest.raises(RateLimitExceeded) as info:
        limiter.check("ws")
    assert info.value.retry_after_s == 1


def test_retry_after_is_at_least_one_second() -> None:
    limiter = RateLimiter(rate_per_s=50, burst=2, clock=FakeClock(500.0))
    drain(limiter, "ws", 2)
    with pytest.raises(RateLimitExceeded) as info:
        limiter.check("ws")
    assert info.value.retry_after_s == 1


def test_retry_after_for_a_larger_cost() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=10, clock=FakeClock(500.0))
    drain(limiter, "ws", 10)
    with pytest.raises(RateLimitExceeded) as info:
        limiter.check("ws", cost=4)
    assert info.value.retry_after_s == 4


def test_refill_over_time_up_to_burst() -> None:
    clock = FakeClock(500.0)
    limiter = RateLimiter(rate_per_s=2, burst=4, clock=clock)
    drain(limiter, "ws", 4)
    clock.now += 1.0  # two tokens back
    drain(limiter, "ws", 2)
    with pytest.raises(QuotaExceeded):
        limiter.check("ws")

    clock.now += 3600  # refill never exceeds the burst
    drain(limiter, "ws", 4)
    with pytest.raises(QuotaExceeded):
        limiter.check("ws")


def test_refused_requests_cost_nothing() -> None:
    clock = FakeClock(500.0)
    limiter = RateLimiter(rate_per_s=1, burst=1, clock=clock)
    limiter.check("ws")
    for _ in range(10):
        with pytest.raises(QuotaExceeded):
            limiter.check("ws")
    clock.now += 1.0
    limiter.check("ws")


def test_workspaces_are_independent() -> None:
    clock = FakeClock(500.0)
    limiter = RateLimiter(rate_per_s=1, burst=2, clock=clock)
    drain(limiter, "a", 2)
    with pytest.raises(QuotaExceeded):
        limiter.check("a")
    drain(limiter, "b", 2)
    with pytest.raises(QuotaExceeded):
        limiter.check("b")
    assert limiter.tracked_workspaces == 2


def test_rate_zero_disables() -> None:
    limiter = RateLimiter(rate_per_s=0, burst=1, clock=FakeClock(500.0))
    assert not limiter.enabled
    drain(limiter, "ws", 10_000)
    assert limiter.tracked_workspaces == 0


def test_idle_buckets_are_forgotten() -> None:
    clock = FakeClock(500.0)
    limiter = RateLimiter(rate_per_s=10, burst=5, clock=clock)
    for i in range(100):
        limiter.check(f"ws-{i}")
    assert limiter.tracked_workspaces == 100

    clock.now += 300  # idle, but not for long enough
    limiter.check("active")
    assert limiter.tracked_workspaces == 101

    clock.now += 301  # the first hundred have now been idle for over ten minutes
    limiter.check("active")
    assert limiter.tracked_workspaces == 1


def test_slowly_refilling_buckets_are_kept_until_full() -> None:
    """Forgetting a bucket must never grant tokens it would not have had."""
    clock = FakeClock(500.0)
    limiter = RateLimiter(rate_per_s=0.1, burst=100, clock=clock)  # 1000 s to refill
    drain(limiter, "ws", 100)
    clock.now += 700
    limiter.check("other")  # triggers a sweep
    assert limiter.tracked_workspaces == 2
    drain(limiter, "ws", 70)
    with pytest.raises(QuotaExceeded):
        limiter.check("ws")


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgument):
        RateLimiter(rate_per_s=-1, burst=1)
    with pytest.raises(InvalidArgument):
        RateLimiter(rate_per_s=1, burst=0)
    limiter = RateLimiter(rate_per_s=1, burst=2, clock=FakeClock(500.0))
    with pytest.raises(InvalidArgument):
        limiter.check("ws", cost=3)
    with pytest.raises(InvalidArgument):
        limiter.check("ws", cost=-1)


def test_config_from_env() -> None:
    assert RateLimitConfig.from_env({}) == RateLimitConfig(rate_per_s=50.0, burst=100)
    env = {"CRYOBOX_RATE_LIMIT_PER_S": "2.5", "CRYOBOX_RATE_LIMIT_BURST": "7"}
    assert RateLimitConfig.from_env(env) == RateLimitConfig(rate_per_s=2.5, burst=7)
    assert RateLimitConfig.from_env(env, rate_per_s=None, burst=9) == RateLimitConfig(rate_per_s=2.5, burst=9)
    disabled = RateLimitConfig.from_env({"CRYOBOX_RATE_LIMIT_PER_S": "0"})
    assert not disabled.enabled
    assert not RateLimiter.from_config(disabled).enabled


@pytest.mark.parametrize(
    "env",
    [
        {"CRYOBOX_RATE_LIMIT_PER_S": "fast"},
        {"CRYOBOX_RATE_LIMIT_PER_S": "-1"},
        {"CRYOBOX_RATE_LIMIT_PER_S": "inf"},
        {"CRYOBOX_RATE_LIMIT_BURST": "0"},
        {"CRYOBOX_RATE_LIMIT_BURST": "2.5"},
    ],
)
def test_config_rejects_bad_values(env: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        RateLimitConfig.from_env(env)
