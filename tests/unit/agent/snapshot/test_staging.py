"""The staging reserve: one buffer faulted in once, in the background, and kept for the agent's life."""

from __future__ import annotations

import asyncio
import mmap
import time
from collections.abc import Callable

import pytest

from cryobox.agent.snapshot import staging
from cryobox.agent.snapshot.staging import StagingPool, allocate, reserve_from_env, start_warming
from cryobox.errors import InvalidArgument

MIB = 1 << 20


def test_the_reserve_is_warmed_once_and_never_trimmed() -> None:
    now = [0.0]
    pool = StagingPool(keep_s=60.0, max_bytes=4 * MIB, reserve_bytes=8 * MIB, clock=lambda: now[0])
    assert pool.take(MIB) is None  # nothing warm yet: the capture allocates its own
    assert pool.reserved_bytes == 0  # what the agent reports as held: nothing yet

    calls: list[int] = []

    async def run(allocate: Callable[[int], mmap.mmap], size: int) -> mmap.mmap:
        calls.append(size)
        return allocate(size)

    asyncio.run(pool.warm(run))
    asyncio.run(pool.warm(run))  # once
    assert calls == [8 * MIB] and pool.kept_bytes == 8 * MIB and pool.reserved_bytes == 8 * MIB
    reserve = pool.take(6 * MIB)
    assert reserve is not None and len(reserve) == 8 * MIB
    small = staging.allocate(2 * MIB)
    pool.release(small)
    pool.release(reserve)
    assert pool.kept_bytes == 10 * MIB  # the reserve does not count against max_bytes
    assert pool.take(MIB) is small  # the smallest that fits: the reserve stays for the big ones
    pool.release(small)
    now[0] += 3600.0
    pool.trim()
    assert small.closed and not reserve.closed and pool.kept_bytes == 8 * MIB
    for size in (4 * MIB, 4 * MIB):  # two more buffers over max_bytes: the smaller goes, the reserve stays
        pool.release(staging.allocate(size))
    assert pool.kept_bytes == 12 * MIB and not reserve.closed
    pool.close()
    assert reserve.closed and pool.kept_bytes == 0 and pool.reserved_bytes == 0
    asyncio.run(pool.warm(run))
    assert calls == [8 * MIB]  # a closed pool warms nothing


def test_a_reserve_warmed_after_close_is_unmapped() -> None:
    pool = StagingPool(reserve_bytes=2 * MIB)
    made: list[mmap.mmap] = []

    async def run(allocate: Callable[[int], mmap.mmap], size: int) -> mmap.mmap:
        pool.close()  # the agent stops while the reserve is being faulted in
        made.append(allocate(size))
        return made[0]

    asyncio.run(pool.warm(run))
    assert made[0].closed and pool.kept_bytes == 0


async def test_start_warming_faults_it_in_on_a_background_thread() -> None:
    pool = StagingPool(reserve_bytes=4 * MIB)
    await start_warming(pool)
    assert pool.kept_bytes == 4 * MIB
    buffer = pool.take(4 * MIB)
    assert buffer is not None
    pool.release(buffer)
    pool.close()


def test_the_reserve_size_comes_from_the_environment() -> None:
    assert reserve_from_env({}) == 512 * MIB
    assert reserve_from_env({"CRYOBOX_STAGING_RESERVE_MIB": "64"}) == 64 * MIB
    assert reserve_from_env({"CRYOBOX_STAGING_RESERVE_MIB": "0"}) == 0
    for bad in ("lots", "-1"):
        with pytest.raises(InvalidArgument, match="CRYOBOX_STAGING_RESERVE_MIB"):
            reserve_from_env({"CRYOBOX_STAGING_RESERVE_MIB": bad})


async def test_faulting_in_a_reserve_leaves_the_event_loop_free() -> None:
    """``allocate`` runs on a thread; faulting in 512 MiB in one ``madvise`` held the GIL for all of it (~0.25 s
    here), so the loop stalled: it must keep ticking while the pages come in."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    last = time.monotonic()
    job = loop.run_in_executor(None, allocate, 512 << 20)
    while not job.done():
        await asyncio.sleep(0.001)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    (await job).close()
    assert max(gaps) < 0.1, f"the loop stalled {max(gaps):.3f} s ({len(gaps)} ticks)"
    assert len(gaps) > 5  # the loop ran while the pages came in
