"""The MicroVM driver's state machine against a real QEMU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cryobox.agent.guest.exec import run_exec
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import MemoryBacking, MicroVM, VmPaths, VmState
from cryobox.errors import StateError


def _vm(tmp_path: Path, template: Template) -> MicroVM:
    paths = VmPaths(tmp_path / "vm")
    paths.root.mkdir()
    disk = paths.root / "disk.qcow2"
    import subprocess

    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(template.disk), str(disk)], check=True
    )
    return MicroVM("t", template.machine, paths, MemoryBacking(template.memory, share=False), disk)


async def test_lifecycle_guards_and_idempotent_kill(tmp_path: Path, templates: dict[str, Template]) -> None:
    template = templates["base"]
    vm = _vm(tmp_path, template)
    with pytest.raises(StateError):
        await vm.pause()
    await vm.start(incoming=True)
    try:
        assert vm.state.value == "incoming"
        with pytest.raises(StateError):
            await vm.pause()
        guest = await vm.connect_guest()
        await vm.restore(template.vmstate)
        assert vm.state.value == "running"
        assert (await run_exec(guest, "echo restored")).stdout == "restored\n"
        await vm.pause()
        with pytest.raises(StateError):
            await vm.restore(template.vmstate)
        await vm.resume()
        assert (await run_exec(guest, "echo again")).stdout == "again\n"
        pid = vm.pid
        assert pid is not None
    finally:
        await vm.kill()
    await vm.kill()  # idempotent
    assert vm.state is VmState.KILLED
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert vm.paths.console_log.exists()
    shutil.rmtree(vm.paths.root)


async def test_template_files_are_never_modified_by_a_restore(tmp_path: Path, templates: dict[str, Template]) -> None:
    template = templates["base"]
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in template.path.iterdir()}
    vm = _vm(tmp_path, template)
    await vm.start(incoming=True)
    try:
        guest = await vm.connect_guest()
        await vm.restore(template.vmstate)
        await run_exec(guest, "head -c 64M /dev/urandom > /root/big; sync; echo 3 > /proc/sys/vm/drop_caches")
    finally:
        await vm.kill()
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in template.path.iterdir()}
    assert before == after
