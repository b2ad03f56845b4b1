"""The MicroVM driver's state machine against a real QEMU."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cryobox.agent.guest.client import GuestClient
from cryobox.agent.guest.exec import run_exec
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import MemoryBacking, MicroVM, VmPaths, VmState
from cryobox.agent.vm.jail import JailSettings, VmJail, prepare_host
from cryobox.errors import StateError


def _vm(tmp_path: Path, template: Template) -> MicroVM:
    paths = VmPaths(tmp_path / "vm")
    paths.root.mkdir()
    disk = paths.root / "disk.qcow2"
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


async def test_a_jailed_start_cancelled_mid_launch_leaves_no_qemu(
    tmp_path: Path, templates: dict[str, Template]
) -> None:
    """A start cancelled while the jail's launcher runs (a stopping agent, a pool shrinking) used to leave the QEMU
    the launcher forked running, unknown to anyone, holding its slot's tap: the launch now waits for the launcher
    and kills what the VM's cgroup holds."""
    template = templates["base"]
    settings = JailSettings.for_tag(secrets.token_hex(3))
    assert settings is not None and settings.cgroups is not None, "the suite runs VMs jailed, with cgroups"
    await asyncio.to_thread(prepare_host, settings)
    memory = tmp_path / "memory"  # a copy: the jail hands a private RAM file to its image group
    subprocess.run(["cp", "--sparse=always", str(template.memory), str(memory)], check=True)
    paths = VmPaths(tmp_path / "vm")
    paths.root.mkdir()
    disk = paths.root / "disk.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(template.disk), str(disk)], check=True
    )
    vm_id = f"vm-{secrets.token_hex(8)}"
    jail = VmJail(settings, settings.slot_uid(0))
    vm = MicroVM(vm_id, template.machine, paths, MemoryBacking(memory, share=False), disk, jail=jail)
    starting = asyncio.create_task(vm.start(incoming=True))
    try:
        deadline = time.monotonic() + 30
        while not settings.cgroups.members(vm_id):  # the launcher has joined the VM's cgroup: it runs
            assert time.monotonic() < deadline and not starting.done(), "the launcher never joined its cgroup"
            await asyncio.sleep(0.001)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert settings.cgroups.members(vm_id) == set(), "the cancelled launch's QEMU still runs"
        assert not any(path.exists() for path in settings.cgroups.dirs(vm_id))
        assert not _named_processes(f"cryobox-{vm_id}")
    finally:
        settings.cgroups.kill(vm_id)
        await vm.kill()
        await asyncio.to_thread(jail.release, vm_id)
        settings.cgroups.remove_base()


def _named_processes(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if name.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def _main_thread_switches(guest: GuestClient) -> int:
    """The guest agent's main thread's voluntary context switches (the exec's shell is the agent's child)."""
    probe = await run_exec(guest, "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; grep ^voluntary_ctxt /proc/$PPID/status")
    cmdline, switches = probe.stdout.splitlines()
    assert "cryobox_guest" in cmdline, probe.stdout
    return int(switches.split()[1])


async def test_a_guest_whose_host_is_away_sleeps_until_it_returns(
    tmp_path: Path, templates: dict[str, Template]
) -> None:
    """While nobody holds the host end of the agent's port (an agent restarting: 50 such guests used to burn 0.7
    of a host core reopening it), the guest agent sleeps until the kernel tells it the host is back, then answers
    at once."""
    template = templates["base"]
    vm = _vm(tmp_path, template)
    await vm.start(incoming=True)
    try:
        guest = await vm.connect_guest()
        await vm.restore(template.vmstate)
        before = await _main_thread_switches(guest)
        await guest.aclose()
        await asyncio.sleep(3.0)  # the host is away
        reconnected = time.monotonic()
        guest = await vm.connect_guest()
        after = await _main_thread_switches(guest)
        answered_s = time.monotonic() - reconnected
    finally:
        await vm.kill()
    # the hang-up, the wait, the wake and the probes' own frames: 9 measured, however long the host stays away;
    # the loop that reopened the port every 250 ms made 24 in these 3 s
    assert after - before <= 14, (before, after)
    assert answered_s < 2.0, answered_s
