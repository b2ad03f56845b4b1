"""The warm pool never hands out a QEMU that died while it waited (its process is checked, not only its state)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from cryobox.agent.sandbox.factory import PoolMode, PrespawnPool
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
