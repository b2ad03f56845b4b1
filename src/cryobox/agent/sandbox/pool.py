"""The warm pool: QEMUs prepared per template before a create asks, so a create is a continue (``warm``) or a
state load (``spawned``), never a process start. See docs/design/snapshots.md ("Create = restore")."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import TYPE_CHECKING

from ..templates.bake import Template
from ..vm import MicroVM

if TYPE_CHECKING:
    from .factory import VmFactory

log = logging.getLogger(__name__)


class PoolMode(enum.Enum):
    """How far a pooled VM is prepared before a create takes it.

    ``spawned``: QEMU is up in ``-incoming defer`` (memory mapped, disk overlay, sockets connected); the create
    loads the snapshot's device state and continues it.
    ``warm``: the snapshot is already loaded and one ``exec true`` ran (filling TCG's translation cache for the
    exec path, ~300 ms under TCG), then the vCPUs were stopped; the create only continues it. Either way the
    sandbox is a fresh restore of the template that no one has used; the clock is stepped at hand-out.
    """

    SPAWNED = "spawned"
    WARM = "warm"

    @property
    def preloads_state(self) -> bool:
        return self is PoolMode.WARM


REFILL_AFTER_TAKE_S = 0.25
"""How long after a create took a pooled VM its replacement starts. Spawning one is work on the agent's loop (the
jail's fork and exec, QMP, the slot) and a QEMU starting at full CPU weight; started at once it ran beside the
create that took the VM and its first exec. Measured (`base`, TCG, 2 cores, a create and an exec every second,
p50 of 25, two runs each): the agent's share of a create 20.4 / 21.8 → 14.2 / 16.0 ms, create → first exec
52.2 / 55.1 → 41.8 / 48.0 ms. A refill takes ~1 s under TCG either way, so the delay changes which creates a
burst finds the pool empty for very little."""


class PrespawnPool:
    """Keeps up to ``size`` prepared QEMUs per template, so a create skips process start-up (and, in ``warm``
    mode, the state load and the cold first exec).

    ``take()`` never waits for the refill: an empty pool spawns inline (state not loaded) and refills at once; a VM
    taken from the pool is replaced ``refill_after_take_s`` later (:data:`REFILL_AFTER_TAKE_S`).
    """

    def __init__(
        self,
        factory: VmFactory,
        template: Template,
        size: int,
        mode: PoolMode = PoolMode.WARM,
        *,
        refill_after_take_s: float = REFILL_AFTER_TAKE_S,
    ) -> None:
        self.factory = factory
        self.template = template
        self.size = size
        self.mode = mode
        self.refill_after_take_s = refill_after_take_s
        self._ready: list[MicroVM] = []
        self._spawning = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    @property
    def held_count(self) -> int:
        """QEMUs the pool holds, ready or being prepared (each maps its template's memory)."""
        return len(self._ready) + self._spawning

    async def take(self) -> MicroVM:
        while self._ready:
            vm = self._ready.pop(0)
            if vm.state.alive and vm.alive():  # a pooled QEMU can die while it waits
                self.factory.set_background(vm, False)
                self.refill_later(self.refill_after_take_s)  # the create and its first exec go first
                return vm
            await self.factory.destroy(vm)
        self.refill()
        return await self.factory.spawn_incoming(self.template)

    def refill_later(self, delay_s: float) -> None:
        """:meth:`refill` in ``delay_s`` (at once if a :meth:`take` finds the pool empty first): an agent that
        adopted running sandboxes lets their first requests after its restart go before the pool's QEMUs take the
        cores, and a create that took a pooled VM goes before its replacement's spawn."""
        if delay_s <= 0:
            self.refill()
            return

        async def later() -> None:
            await asyncio.sleep(delay_s)
            self.refill()

        task = asyncio.create_task(later())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def refill(self) -> None:
        while not self._closed and len(self._ready) + self._spawning < self.size:
            self._spawning += 1
            task = asyncio.create_task(self._spawn_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _spawn_one(self) -> None:
        try:
            vm = await self.factory.spawn_incoming(self.template)
            self.factory.set_background(vm, True)  # its warm-up yields the cores to what runs meanwhile
            if self.mode.preloads_state:
                await self.factory.warm(vm, self.template)
        except Exception as err:
            log.warning("pool %s: preparing a VM failed: %s", self.template.name, err)
            return
        finally:
            self._spawning -= 1
        if self._closed:
            await self.factory.destroy(vm)
        else:
            self._ready.append(vm)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        while self._ready:
            await self.factory.destroy(self._ready.pop())
