"""Admission control for restores, on a real event loop with short timeouts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from cryobox.agent.sandbox.admission import AdmissionConfig, AdmissionController, AdmissionObserver
from cryobox.errors import HostUnavailable, InvalidArgument
from tests.support.clock import FakeClock


class RecordingObserver:
    def __init__(self) -> None:
        self.waits: list[tuple[float, bool]] = []
        self.depths: list[int] = []

    def on_wait(self, seconds: float, admitted: bool) -> None:
        self.waits.append((seconds, admitted))

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)


class Tracker:
    """Counts concurrent holders of a slot and remembers the peak."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.order: list[int] = []

    async def hold(self, ctrl: AdmissionController, ident: int, seconds: float) -> None:
        async with ctrl.slot():
            self.order.append(ident)
            self.current += 1
            self.peak = max(self.peak, self.current)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.current -= 1


def controller(
    max_concurrent: int = 1,
    queue_length: int = 8,
    timeout_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    observer: AdmissionObserver | None = None,
) -> AdmissionController:
    config = AdmissionConfig(max_concurrent=max_concurrent, queue_length=queue_length, timeout_s=timeout_s)
    return AdmissionController(config, clock=clock, observer=observer)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# -- configuration --------------------------------------------------------------------------------------------


def test_config_defaults_and_env() -> None:
    assert AdmissionConfig.from_env({}) == AdmissionConfig(max_concurrent=4, queue_length=64, timeout_s=30.0)
    env = {
        "CRYOBOX_MAX_CONCURRENT_RESTORES": "2",
        "CRYOBOX_ADMISSION_QUEUE": "0",
        "CRYOBOX_ADMISSION_TIMEOUT_S": "1.5",
    }
    assert AdmissionConfig.from_env(env) == AdmissionConfig(max_concurrent=2, queue_length=0, timeout_s=1.5)


def test_config_overrides_win_unless_none() -> None:
    env = {"CRYOBOX_MAX_CONCURRENT_RESTORES": "2", "CRYOBOX_ADMISSION_QUEUE": "3"}
    config = AdmissionConfig.from_env(env, max_concurrent=7, queue_length=None, timeout_s=None)
    assert config == AdmissionConfig(max_concurrent=7, queue_length=3, timeout_s=30.0)


@pytest.mark.parametrize(
    "env",
    [
        {"CRYOBOX_MAX_CONCURRENT_RESTORES": "0"},
        {"CRYOBOX_MAX_CONCURRENT_RESTORES": "-1"},
        {"CRYOBOX_MAX_CONCURRENT_RESTORES": "two"},
        {"CRYOBOX_ADMISSION_QUEUE": "-1"},
        {"CRYOBOX_ADMISSION_QUEUE": "1.5"},
        {"CRYOBOX_ADMISSION_TIMEOUT_S": "0"},
        {"CRYOBOX_ADMISSION_TIMEOUT_S": "nan"},
        {"CRYOBOX_ADMISSION_TIMEOUT_S": "soon"},
    ],
)
def test_config_rejects_bad_values(env: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        AdmissionConfig.from_env(env)


def test_config_rejects_bad_override_and_unknown_key() -> None:
    with pytest.raises(InvalidArgument):
        AdmissionConfig.from_env({}, max_concurrent=0)
    with pytest.raises(TypeError):
        AdmissionConfig.from_env({}, max_restores=3)


# -- admission ------------------------------------------------------------------------------------------------


async def test_concurrency_never_exceeds_max() -> None:
    ctrl = controller(max_concurrent=3, queue_length=100)
    tracker = Tracker()
    await asyncio.gather(*(tracker.hold(ctrl, i, 0.005) for i in range(20)))
    assert tracker.peak == 3
    assert sorted(tracker.order) == list(range(20))
    assert ctrl.running == 0
    assert ctrl.queue_depth == 0


async def test_fifo_order_and_no_barging() -> None:
    ctrl = controller(max_concurrent=1)
    order: list[str] = []

    async def request(name: str) -> None:
        async with ctrl.slot():
            order.append(name)
            await asyncio.sleep(0.001)

    holder = ctrl.slot()
    await holder.__aenter__()
    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(request(f"w{i}")))
        await settle()
        assert ctrl.queue_depth == i + 1
    await holder.__aexit__(None, None, None)
    # A newcomer arriving right after the release must not overtake the queue.
    tasks.append(asyncio.create_task(request("late")))
    await asyncio.gather(*tasks)
    assert order == ["w0", "w1", "w2", "w3", "w4", "late"]
    assert (ctrl.running, ctrl.queue_depth) == (0, 0)


async def test_queue_full_refuses_immediately() -> None:
    ctrl = controller(max_concurrent=1, queue_length=2)
    holder = ctrl.slot()
    await holder.__aenter__()
    waiters = [asyncio.create_task(Tracker().hold(ctrl, i, 0)) for i in range(2)]
    await settle()
    assert ctrl.queue_depth == 2

    started = time.monotonic()
    with pytest.raises(HostUnavailable, match="admission queue full") as info:
        async with ctrl.slot():
            pytest.fail("must not be admitted")
    assert time.monotonic() - started < 1.0  # far below the 5 s queue timeout
    assert info.value.retry_after_s >= 1
    assert info.value.http_status == 503
    assert ctrl.queue_depth == 2

    await holder.__aexit__(None, None, None)
    await asyncio.gather(*waiters)
    assert (ctrl.running, ctrl.queue_depth) == (0, 0)


async def test_zero_length_queue_refuses_when_busy() -> None:
    ctrl = controller(max_concurrent=1, queue_length=0)
    async with ctrl.slot():
        with pytest.raises(HostUnavailable, match="queue full"):
            async with ctrl.slot():
                pass
    async with ctrl.slot():
        assert ctrl.running == 1


async def test_retry_after_follows_recent_durations() -> None:
    clock = FakeClock(1000.0)
    ctrl = controller(max_concurrent=1, queue_length=1, clock=clock)
    assert ctrl.retry_after_s(5) == 5  # default estimate of 1 s per restore before any history
    async with ctrl.slot():
        clock.now += 4.0
    assert ctrl.duration_estimate_s == pytest.approx(4.0)

    holder = ctrl.slot()
    await holder.__aenter__()
    waiter = asyncio.create_task(Tracker().hold(ctrl, 0, 0))
    await settle()
    with pytest.raises(HostUnavailable) as info:
        async with ctrl.slot():
            pass
    assert info.value.retry_after_s == 4  # one ahead * 4 s / 1 slot
    await holder.__aexit__(None, None, None)
    await waiter

    assert ctrl.retry_after_s(0) == 1  # clamped low
    assert ctrl.retry_after_s(1000) == 30  # clamped high


async def test_timeout_in_queue() -> None:
    ctrl = controller(max_concurrent=1, queue_length=4, timeout_s=0.05)
    holder = ctrl.slot()
    await holder.__aenter__()
    started = time.monotonic()
    with pytest.raises(HostUnavailable, match=r"waited \d+\.\ds for a restore slot") as info:
        async with ctrl.slot():
            pytest.fail("must not be admitted")
    assert time.monotonic() - started >= 0.045
    assert info.value.retry_after_s >= 1
    assert ctrl.queue_depth == 0
    assert ctrl.running == 1
    await holder.__aexit__(None, None, None)
    assert ctrl.running == 0


async def test_timed_out_waiter_does_not_block_later_ones() -> None:
    ctrl = controller(max_concurrent=1, queue_length=4, timeout_s=0.4)
    holder = ctrl.slot()
    await holder.__aenter__()

    async def short_wait() -> None:
        async with ctrl.slot():
            pass

    # One waiter times out while a later one, queued behind it, is still admitted afterwards.
    early = asyncio.create_task(short_wait())
    await settle()
    await asyncio.sleep(0.2)
    late = asyncio.create_task(short_wait())
    await settle()
    with pytest.raises(HostUnavailable):
        await early
    assert ctrl.queue_depth == 1
    await holder.__aexit__(None, None, None)
    await late
    assert (ctrl.running, ctrl.queue_depth) == (0, 0)


async def test_cancelled_waiter_leaves_queue_and_leaks_nothing() -> None:
    ctrl = controller(max_concurrent=1, queue_length=4)
    holder = ctrl.slot()
    await holder.__aenter__()
    entered = False

    async def waiter() -> None:
        nonlocal entered
        async with ctrl.slot():
            entered = True

    task = asyncio.create_task(waiter())
    await settle()
    assert ctrl.queue_depth == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ctrl.queue_depth == 0
    assert not entered

    await holder.__aexit__(None, None, None)
    assert ctrl.running == 0
    tracker = Tracker()
    await asyncio.wait_for(asyncio.gather(*(tracker.hold(ctrl, i, 0.001) for i in range(5))), 2)
    assert tracker.order == [0, 1, 2, 3, 4]
    assert (ctrl.running, ctrl.queue_depth) == (0, 0)


async def test_cancel_right_after_hand_off_passes_the_slot_on() -> None:
    ctrl = controller(max_concurrent=1, queue_length=4)
    holder = ctrl.slot()
    await holder.__aenter__()
    order: list[str] = []

    async def waiter(name: str) -> None:
        async with ctrl.slot():
            order.append(name)

    first = asyncio.create_task(waiter("first"))
    await settle()
    second = asyncio.create_task(waiter("second"))
    await settle()
    assert ctrl.queue_depth == 2

    # Release hands the slot to ``first``; cancel it before it gets to run.
    await holder.__aexit__(None, None, None)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)
    assert order == ["second"]
    assert (ctrl.running, ctrl.queue_depth) == (0, 0)


async def test_cancelled_holder_releases_slot() -> None:
    ctrl = controller(max_concurrent=1)
    task = asyncio.create_task(Tracker().hold(ctrl, 0, 10))
    await settle()
    assert ctrl.running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ctrl.running == 0


async def test_body_exception_releases_slot() -> None:
    ctrl = controller(max_concurrent=1, queue_length=0)
    with pytest.raises(ValueError, match="restore failed"):
        async with ctrl.slot():
            assert ctrl.running == 1
            raise ValueError("restore failed")
    assert ctrl.running == 0
    async with ctrl.slot():  # with a zero-length queue this would be refused if the slot had leaked
        assert ctrl.running == 1


async def test_observer_receives_waits_and_depths() -> None:
    observer = RecordingObserver()
    ctrl = controller(max_concurrent=1, queue_length=1, timeout_s=0.05, observer=observer)

    async with ctrl.slot():  # immediate
        pass
    holder = ctrl.slot()
    await holder.__aenter__()  # immediate
    with pytest.raises(HostUnavailable):  # times out in the queue
        async with ctrl.slot():
            pass
    queued = asyncio.create_task(Tracker().hold(ctrl, 0, 0))
    await settle()
    with pytest.raises(HostUnavailable):  # queue full
        async with ctrl.slot():
            pass
    await asyncio.sleep(0.01)
    await holder.__aexit__(None, None, None)
    await queued

    admitted = [seconds for seconds, ok in observer.waits if ok]
    refused = [seconds for seconds, ok in observer.waits if not ok]
    assert len(admitted) == 3
    assert admitted[:2] == [0.0, 0.0]
    assert admitted[2] >= 0.005
    assert len(refused) == 2
    assert refused[0] >= 0.045  # the timeout
    assert refused[1] == 0.0  # the queue-full refusal
    assert observer.depths[-1] == 0
    assert max(observer.depths) == 1


async def test_burst_of_fifty_admits_exactly_running_plus_queue() -> None:
    """4 slots + 8 queue places, 50 simultaneous requests: 12 run, 38 are refused at once."""
    ctrl = controller(max_concurrent=4, queue_length=8, timeout_s=5.0)
    tracker = Tracker()
    results = await asyncio.gather(*(tracker.hold(ctrl, i, 0.05) for i in range(50)), return_exceptions=True)

    refused = [r for r in results if isinstance(r, HostUnavailable)]
    assert len(refused) == 38
    assert all(r is None or isinstance(r, HostUnavailable) for r in results)
    assert all(r.retry_after_s >= 1 for r in refused)
    assert sorted(tracker.order) == list(range(12))  # the first twelve to arrive, in arrival order
    assert tracker.order == list(range(12))
    assert tracker.peak == 4
    assert (ctrl.running, ctrl.queue_depth) == (0, 0)
