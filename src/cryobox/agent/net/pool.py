"""A pool of pre-built network slots, so handing one to a new sandbox costs a deque pop, not a netlink build.

* A background task keeps ``size`` idle slots built (one build at a time, on a worker thread).
* ``acquire`` pops an idle slot (O(1)); only when the pool is drained does it build one inline.
* ``release`` puts it back (recycled: its netns, veth and tap stay), unless ``max_idle`` slots are already idle,
  in which case it is destroyed and its index freed.
* Indices come from :class:`IndexAllocator`: lowest free index first, and an index is never handed to two live
  slots.
* ``close`` destroys every slot the pool built, idle or leased.

A slot holds no grant of its own: what a guest may reach is the egress service's policy for the sandbox it
serves, detached before the slot comes back (:meth:`..sandbox.factory.VmFactory.destroy`); a slot nobody serves
answers every connection of its guest with a reset.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from cryobox.errors import HostUnavailable, InvalidArgument, StateError

from .slots import Slot, SlotPlan

log = logging.getLogger(__name__)
Clock = Callable[[], float]


class SlotBuilder(Protocol):
    """Creates and destroys slots (blocking; the pool calls it on worker threads)."""

    def create(self, slot: Slot) -> None: ...

    def destroy(self, slot: Slot) -> None: ...


class IndexAllocator:
    """Lowest free index first: freed indices live in a min-heap, everything at or above ``_next`` is unused."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._next = 0
        self._freed: list[int] = []
        self._live: set[int] = set()

    def take(self) -> int:
        if self._freed:
            index = heapq.heappop(self._freed)
        elif self._next < self.capacity:
            index = self._next
            self._next += 1
        else:
            raise HostUnavailable(f"all {self.capacity} network slots are in use", details={"capacity": self.capacity})
        self._live.add(index)
        return index

    def claim(self, index: int) -> None:
        """Mark ``index`` taken (a slot adopted from an earlier agent)."""
        if index in self._live or not 0 <= index < self.capacity:
            raise StateError(f"slot index {index} cannot be claimed", state="allocated", required="free")
        if index >= self._next:
            self._freed.extend(range(self._next, index))
            heapq.heapify(self._freed)
            self._next = index + 1
        else:
            self._freed.remove(index)
            heapq.heapify(self._freed)
        self._live.add(index)

    def give(self, index: int) -> None:
        if index not in self._live:
            raise StateError(f"slot index {index} is not allocated", state="free", required="allocated")
        self._live.remove(index)
        heapq.heappush(self._freed, index)

    @property
    def live(self) -> int:
        return len(self._live)


@dataclass(frozen=True)
class PoolStats:
    idle: int
    leased: int
    building: int
    built: int
    destroyed: int
    recycled: int
    warm_acquires: int
    cold_acquires: int
    last_acquire_s: float
    max_acquire_s: float
    mean_acquire_s: float
    p50_acquire_s: float
    p99_acquire_s: float
    mean_build_s: float


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class SlotPool:
    def __init__(
        self,
        plan: SlotPlan,
        size: int = 8,
        builder: SlotBuilder | None = None,
        *,
        max_idle: int | None = None,
        retry_s: float = 1.0,
        clock: Clock = time.perf_counter,
    ) -> None:
        if size < 0:
            raise InvalidArgument(f"pool size must be >= 0, got {size}")
        if builder is None:
            from .netlink import NetlinkBuilder  # imported lazily: unit tests with a fake builder need no pyroute2

            builder = NetlinkBuilder()
        self.plan = plan
        self.size = size
        self.max_idle = max(size, 2 * size if max_idle is None else max_idle)
        self._builder = builder
        self._retry_s = retry_s
        self._clock = clock
        self._indices = IndexAllocator(plan.capacity)
        self._idle: deque[Slot] = deque()
        self._leased: dict[int, Slot] = {}
        self._built: dict[int, Slot] = {}
        self._tasks: set[asyncio.Task[Slot]] = set()
        self._filler: asyncio.Task[None] | None = None
        self._leftovers: list[int] = []
        self._reclaimer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._building = 0
        self._destroyed = self._recycled = self._warm = self._cold = self._builds = 0
        self._build_s = self._acquire_total_s = self._acquire_max_s = self._acquire_last_s = 0.0
        self._acquire_recent: deque[float] = deque(maxlen=1024)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background filler (needs a running loop; ``acquire`` starts it too)."""
        if self._closed:
            raise StateError("slot pool is closed", state="closed", required="open")
        if self._filler is None:
            self._filler = asyncio.get_running_loop().create_task(self._fill(), name="cryobox-slot-filler")
        if self._leftovers and self._reclaimer is None:
            self._reclaimer = asyncio.get_running_loop().create_task(self._reclaim(), name="cryobox-slot-reclaim")

    async def wait_warm(self, timeout: float = 30.0) -> None:
        """Wait until ``size`` slots are idle (benchmarks and tests; a server never needs to)."""
        self.start()
        deadline = self._clock() + timeout
        while len(self._idle) < self.size:
            if self._clock() > deadline:
                raise TimeoutError(f"slot pool not warm after {timeout}s ({len(self._idle)}/{self.size} idle)")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        """Stop filling, wait for builds in flight, clear leased slots' egress and destroy every slot we built."""
        self._closed = True
        await self._stop_reclaim()
        if self._filler is not None:
            self._filler.cancel()
            await asyncio.gather(self._filler, return_exceptions=True)
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        leased = list(self._leased.values())
        slots = list(self._built.values())
        leftovers = [self.plan.slot(index) for index in self._leftovers]
        self._idle.clear()
        self._leased.clear()
        for slot in await asyncio.to_thread(self._teardown, leased, slots):
            self._forget(slot)
        for slot in await asyncio.to_thread(self._teardown, [], leftovers):  # an earlier agent's, not yet gone
            self._leftovers.remove(slot.index)
            self._indices.give(slot.index)

    def _teardown(self, leased: list[Slot], slots: list[Slot]) -> list[Slot]:
        """Worker thread: destroy everything; returns the slots actually destroyed."""
        destroyed = []
        for slot in slots:
            try:
                self._builder.destroy(slot)
            except Exception:
                log.exception("destroying %s at close failed", slot.netns)
                continue
            destroyed.append(slot)
        return destroyed

    async def detach(self) -> None:
        """Stop filling and building, leaving every slot as it is: leased ones for their VMs (which outlive us), idle
        ones for the next agent's pool to destroy in the background (:meth:`reclaim_later`), or ``cryobox gc``.
        Destroying 16 idle slots here took ~2 s of a stop that a restart or an upgrade waits for."""
        self._closed = True
        await self._stop_reclaim()
        if self._filler is not None:
            self._filler.cancel()
            await asyncio.gather(self._filler, return_exceptions=True)
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._idle.clear()

    async def __aenter__(self) -> SlotPool:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- acquire / release ----------------------------------------------------------------------------------------

    async def acquire(self) -> Slot:
        """A ready slot: O(1) when warm, otherwise built inline. Raises ``HostUnavailable`` when out of indices."""
        started = self._clock()
        self.start()
        if self._idle:
            slot = self._idle.popleft()
            self._warm += 1
        else:
            task = self._start_build()
            try:
                slot = await asyncio.shield(task)
            except asyncio.CancelledError:
                task.add_done_callback(self._adopt)  # the build finishes anyway: keep the slot as idle
                raise
            self._cold += 1
        self._leased[slot.index] = slot
        self._wake.set()
        elapsed = self._clock() - started
        self._acquire_last_s = elapsed
        self._acquire_total_s += elapsed
        self._acquire_max_s = max(self._acquire_max_s, elapsed)
        self._acquire_recent.append(elapsed)
        return slot

    def reclaim_later(self, indices: Iterable[int]) -> None:
        """An earlier agent's leftover slots at ``indices`` (no adopted VM uses them): never handed out, destroyed in
        the background once :meth:`start` runs, their indices free again one by one. A pool closed first leaves the
        rest on the host for the next agent's reclaim."""
        for index in indices:
            self._indices.claim(index)
            self._leftovers.append(index)

    async def _reclaim(self) -> None:
        while self._leftovers:
            slot = self.plan.slot(self._leftovers[0])
            try:
                await asyncio.to_thread(self._builder.destroy, slot)
            except Exception:
                log.exception("destroying leftover slot %s failed; left for the next agent", slot.netns)
                return
            self._leftovers.pop(0)
            self._indices.give(slot.index)
            self._wake.set()

    async def _stop_reclaim(self) -> None:
        if self._reclaimer is not None:
            self._reclaimer.cancel()
            await asyncio.gather(self._reclaimer, return_exceptions=True)

    def adopt(self, index: int) -> Slot:
        """Lease the slot ``index`` an earlier agent built and a VM still uses (its netns survived reclaim)."""
        self._indices.claim(index)
        slot = self.plan.slot(index)
        self._built[index] = slot
        self._leased[index] = slot
        return slot

    async def release(self, slot: Slot) -> None:
        """Give ``slot`` back: recycled as idle (or destroyed beyond ``max_idle``)."""
        if self._leased.get(slot.index) != slot:
            raise StateError(f"slot {slot.netns} is not leased from this pool", state="free", required="leased")
        del self._leased[slot.index]
        if self._closed or len(self._idle) >= self.max_idle:
            await asyncio.to_thread(self._builder.destroy, slot)
            self._forget(slot)
        else:
            self._idle.append(slot)
            self._recycled += 1

    # -- internals ------------------------------------------------------------------------------------------------

    def _forget(self, slot: Slot) -> None:
        """``slot`` was destroyed: its index is free again."""
        if self._built.pop(slot.index, None) is not None:
            self._indices.give(slot.index)
            self._destroyed += 1

    def _start_build(self) -> asyncio.Task[Slot]:
        if self._closed:
            raise StateError("slot pool is closed", state="closed", required="open")
        slot = self.plan.slot(self._indices.take())
        task = asyncio.get_running_loop().create_task(self._build(slot), name=f"cryobox-build-{slot.netns}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _build(self, slot: Slot) -> Slot:
        self._building += 1
        started = self._clock()
        try:
            await asyncio.to_thread(self._builder.create, slot)
        except asyncio.CancelledError:
            # the worker thread may still be building: never hand this index out again (reclaim cleans up)
            raise
        except BaseException:
            self._indices.give(slot.index)  # the builder cleaned up after itself
            raise
        finally:
            self._building -= 1
        self._built[slot.index] = slot
        self._builds += 1
        self._build_s += self._clock() - started
        return slot

    def _adopt(self, task: asyncio.Task[Slot]) -> None:
        if not task.cancelled() and task.exception() is None and not self._closed:
            self._idle.append(task.result())

    async def _fill(self) -> None:
        while not self._closed:
            while not self._closed and len(self._idle) < self.size:
                try:
                    task = self._start_build()
                except HostUnavailable:
                    break  # out of indices: wait for a release
                try:
                    slot = await asyncio.shield(task)
                except asyncio.CancelledError:
                    task.add_done_callback(self._adopt)
                    raise
                except Exception:
                    log.exception("building a network slot failed; retrying in %.1fs", self._retry_s)
                    await asyncio.sleep(self._retry_s)
                    continue
                if self._closed:
                    continue
                if len(self._idle) >= self.max_idle:  # releases filled the pool while this one was building
                    await asyncio.to_thread(self._builder.destroy, slot)
                    self._forget(slot)
                else:
                    self._idle.append(slot)
            self._wake.clear()
            await self._wake.wait()

    # -- observability --------------------------------------------------------------------------------------------

    def stats(self) -> PoolStats:
        recent = sorted(self._acquire_recent)
        acquires = self._warm + self._cold
        return PoolStats(
            idle=len(self._idle),
            leased=len(self._leased),
            building=self._building,
            built=len(self._built),
            destroyed=self._destroyed,
            recycled=self._recycled,
            warm_acquires=self._warm,
            cold_acquires=self._cold,
            last_acquire_s=self._acquire_last_s,
            max_acquire_s=self._acquire_max_s,
            mean_acquire_s=self._acquire_total_s / acquires if acquires else 0.0,
            p50_acquire_s=_quantile(recent, 0.5),
            p99_acquire_s=_quantile(recent, 0.99),
            mean_build_s=self._build_s / self._builds if self._builds else 0.0,
        )
