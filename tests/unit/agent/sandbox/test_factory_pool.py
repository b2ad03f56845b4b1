"""The warm pool never hands out a QEMU that died while it waited (its process is checked, not only its state)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from cryobox.agent.sandbox.pool import PoolMode, PrespawnPool
from cryobox.agent.vm import MachineConfig, MemoryBacking, MicroVM, VmPaths, VmState
from cryobox.agent.vm.accel import Accel


def _vm(tmp_path: Path, name: str) -> MicroVM:
    config = MachineConfig(512, 1, Accel.TCG, Path("/k"), Path("/i"), 1, True)
    vm = MicroVM(name, config, VmPaths(tmp_path / name), MemoryBacking(Path("/m"), False), Path("/d"))
    proc = subprocess.Popen(["sleep", "60"])
    vm._proc, vm._pid, vm.state = proc, proc.pid, VmState.PAUSED  # a pooled, warmed VM
    return vm


class FakeFactory:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.destroyed: list[str] = []
        self.spawned = 0
        self.background: dict[str, bool] = {}

    def set_background(self, vm: MicroVM, background: bool) -> None:
        self.background[vm.vm_id] = background

    async def spawn_incoming(self, template: Any) -> MicroVM:
        self.spawned += 1
        return _vm(self.tmp_path, f"vm-fresh-{self.spawned}")

    async def warm(self, vm: MicroVM, template: Any) -> None:
        pass

    async def destroy(self, vm: MicroVM) -> None:
        self.destroyed.append(vm.vm_id)
        if vm._proc is not None:
            vm._proc.kill()
            vm._proc.wait()


async def test_a_pooled_vm_that_died_is_destroyed_not_handed_out(tmp_path: Path) -> None:
    factory = FakeFactory(tmp_path)
    pool = PrespawnPool(factory, object(), size=0, mode=PoolMode.WARM)  # type: ignore[arg-type]
    dead, alive = _vm(tmp_path, "vm-dead"), _vm(tmp_path, "vm-alive")
    assert dead._proc is not None
    dead._proc.kill()
    dead._proc.wait()  # died while pooled; its state still says PAUSED
    pool._ready.extend([dead, alive])
    taken = await pool.take()
    assert taken is alive and factory.destroyed == ["vm-dead"]
    await factory.destroy(taken)
    fresh = await pool.take()
    assert fresh.vm_id == "vm-fresh-1"  # drained: spawned inline
    await factory.destroy(fresh)
    await pool.close()


async def test_a_delayed_refill_waits_its_delay_unless_a_create_comes_first(tmp_path: Path) -> None:
    factory = FakeFactory(tmp_path)
    pool = PrespawnPool(factory, object(), size=2, mode=PoolMode.WARM)  # type: ignore[arg-type]
    pool.refill_later(0.2)  # an agent that adopted sandboxes: their first requests go first
    await asyncio.sleep(0.05)
    assert factory.spawned == 0 and pool.ready_count == 0
    taken = await pool.take()  # a create does not wait for the delay: spawned inline, the pool refills now
    for _ in range(100):
        if pool.ready_count == 2:
            break
        await asyncio.sleep(0.01)
    assert pool.ready_count == 2 and factory.spawned == 3
    await asyncio.sleep(0.3)  # the delayed refill finds the pool full: nothing more
    assert factory.spawned == 3
    await factory.destroy(taken)
    later = PrespawnPool(factory, object(), size=1, mode=PoolMode.WARM)  # type: ignore[arg-type]
    later.refill_later(0.05)
    await asyncio.sleep(0.2)
    assert later.ready_count == 1 and factory.spawned == 4
    await pool.close()
    await later.close()
    assert len(factory.destroyed) == 4  # the one taken, and the three the closed pools held
    assert pool.ready_count == 0 and later.ready_count == 0


async def test_a_pooled_vm_warms_with_a_small_cpu_weight_and_gets_the_normal_one_when_taken(tmp_path: Path) -> None:
    factory = FakeFactory(tmp_path)
    pool = PrespawnPool(factory, object(), size=1, mode=PoolMode.WARM)  # type: ignore[arg-type]
    pool.refill()
    for _ in range(100):
        if pool.ready_count == 1:
            break
        await asyncio.sleep(0.01)
    assert factory.background == {"vm-fresh-1": True}  # yields the cores while it warms and waits
    taken = await pool.take()
    assert taken.vm_id == "vm-fresh-1" and factory.background["vm-fresh-1"] is False  # a sandbox's share now
    await factory.destroy(taken)
    await pool.close()


async def test_a_vm_taken_from_the_pool_is_replaced_after_the_create_not_beside_it(tmp_path: Path) -> None:
    """A replacement spawned at once ran beside the create that took the VM (its loop work and its QEMU's start):
    it starts ``refill_after_take_s`` later."""
    factory = FakeFactory(tmp_path)
    pool = PrespawnPool(factory, object(), size=1, mode=PoolMode.WARM, refill_after_take_s=0.15)  # type: ignore[arg-type]
    pool.refill()
    for _ in range(100):
        if pool.ready_count == 1:
            break
        await asyncio.sleep(0.01)
    assert factory.spawned == 1
    taken = await pool.take()
    await asyncio.sleep(0.05)
    assert factory.spawned == 1 and pool.held_count == 0  # the create still has the cores to itself
    for _ in range(100):
        if pool.ready_count == 1:
            break
        await asyncio.sleep(0.01)
    assert pool.ready_count == 1 and factory.spawned == 2  # replaced after the delay
    await factory.destroy(taken)
    await pool.close()
