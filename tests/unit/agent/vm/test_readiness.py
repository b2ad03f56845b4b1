"""An adopted guest's readiness: calls wait for it, a waiting call goes ahead of the queue, a failure reaches every
waiter, and a cancelled turn never keeps a place."""

from __future__ import annotations

import asyncio

import pytest

from cryobox.agent.vm.readiness import GuestReadiness, wait_turn
from cryobox.errors import GuestError, VmmError


async def test_calls_wait_until_the_guest_is_settled_and_mark_it_wanted() -> None:
    readiness = GuestReadiness()
    waiter = asyncio.create_task(readiness.wait())
    await asyncio.sleep(0)
    assert readiness.wanted.is_set() and not waiter.done()
    readiness.settle()
    await asyncio.wait_for(waiter, 1)
    await readiness.wait()  # settled: at once


async def test_a_failed_guest_fails_every_waiter_now_and_later() -> None:
    readiness = GuestReadiness()
    waiter = asyncio.create_task(readiness.wait())
    await asyncio.sleep(0)
    readiness.settle(VmmError("QEMU exited"))
    readiness.settle()  # settled once: a later settle changes nothing
    with pytest.raises(GuestError, match="QEMU exited"):
        await waiter
    with pytest.raises(GuestError, match="did not come back"):
        await readiness.wait()


async def test_a_wanted_guest_goes_ahead_of_a_full_queue() -> None:
    gate = asyncio.Semaphore(1)
    await gate.acquire()  # every place taken
    wanted = asyncio.Event()
    turn = asyncio.create_task(wait_turn(gate, wanted))
    await asyncio.sleep(0.01)
    assert not turn.done()
    wanted.set()
    assert await asyncio.wait_for(turn, 1) is False  # went ahead, holding no place
    gate.release()
    assert gate._value == 1  # noqa: SLF001 - nothing was kept by the abandoned acquire


async def test_a_turn_takes_a_place_when_one_frees_and_is_wanted_at_once_when_already_wanted() -> None:
    gate = asyncio.Semaphore(1)
    await gate.acquire()
    turn = asyncio.create_task(wait_turn(gate, asyncio.Event()))
    await asyncio.sleep(0.01)
    gate.release()
    assert await asyncio.wait_for(turn, 1) is True
    assert gate.locked()  # the turn holds the place
    gate.release()
    wanted = asyncio.Event()
    wanted.set()
    assert await wait_turn(gate, wanted) is False
    assert not gate.locked()


async def test_a_cancelled_turn_keeps_no_place() -> None:
    gate = asyncio.Semaphore(1)
    await gate.acquire()
    turn = asyncio.create_task(wait_turn(gate, asyncio.Event()))
    await asyncio.sleep(0.01)
    gate.release()  # wakes the turn's acquire ...
    turn.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await turn
    await asyncio.sleep(0)
    assert not gate.locked()
    async with asyncio.timeout(1):
        await gate.acquire()
