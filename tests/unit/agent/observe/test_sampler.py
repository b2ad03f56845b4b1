"""The observer over a real sandbox service on fake VMs (``fake_vm.py``), a fake ``/proc`` and an injected clock:
running sandboxes are sampled from the host without being touched, paused and hibernated ones are not, what the
service lets go is forgotten, a guest that does not answer still gets host figures, the console and the agent's
lines reach the log, and every bound holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cryobox.agent.observe.guestview import MEMINFO, ROOT_GROUPS, ROOT_SIZE
from cryobox.agent.observe.sampler import INTERVAL_ENV, ObserveConfig, SandboxObserver
from cryobox.agent.observe.usage import CLOCK_TICKS
from cryobox.agentapi.models_obs import LogQuery
from cryobox.errors import InvalidArgument
from cryobox.netpolicy import EgressPolicy
from tests.support.fake_vm import FakeVm, Rig, make_rig
from tests.support.procfs import fake_usage

GIB = 1 << 30
MB_GROUPS = "#group: free  frags first [ 2^0 ]\n#0    : 16384 1 0 [ 0 ]\n#1    : 16384 1 0 [ 0 ]\n"


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


def observer_of(rig: Rig, tmp_path: Path, **config: object) -> SandboxObserver:
    cfg = ObserveConfig(**config)  # type: ignore[arg-type]
    return SandboxObserver(rig.service, cfg, clock=rig.clock, monotonic=rig.clock, proc=tmp_path / "proc")


async def running(rig: Rig, tmp_path: Path, sandbox_id: str, pid: int, *, guest: bool = True) -> FakeVm:
    await rig.service.create("base", sandbox_id=sandbox_id, ttl_s=60)
    vm = rig.vm(sandbox_id)
    vm._pid = pid
    fake_usage(tmp_path / "proc", pid, utime=0, rss_kib=100_000)
    if guest:
        vm.fake_guest.files.update(
            {
                MEMINFO: b"MemTotal: 524288 kB\nMemAvailable: 393216 kB\nCached: 65536 kB\n",
                ROOT_SIZE: b"2097152\n",  # 1 GiB: 8 groups of 128 MiB
                ROOT_GROUPS: MB_GROUPS.encode(),
            }
        )
    return vm


def ticks(seconds: float) -> int:
    return round(seconds * CLOCK_TICKS)


async def test_running_sandboxes_are_sampled_on_the_host_and_never_touched(rig: Rig, tmp_path: Path) -> None:
    vm = await running(rig, tmp_path, "sb-1", 4242)
    sandbox = rig.service.get("sb-1")
    observer = observer_of(rig, tmp_path, interval_s=5.0)
    active = sandbox.last_active
    await observer.tick()
    assert observer.series("sb-1").samples == []  # a baseline: CPU is a difference
    rig.clock.advance(5.0)
    fake_usage(tmp_path / "proc", 4242, utime=ticks(2.0), stime=ticks(0.5), rss_kib=200_000)
    await observer.tick()
    [sample] = observer.series("sb-1").samples
    assert sample.cpu_pct == 25.0 and sample.cpu_count == 2  # 2.5 s of CPU in 5 s on 2 vCPUs
    assert sample.memory_bytes == 200_000 * 1024 and sample.timestamp == rig.clock()
    assert (sample.mem_total, sample.mem_used, sample.mem_cache) == (512 << 20, 128 << 20, 64 << 20)
    assert (sample.disk_total, sample.disk_used, sample.guest_view) == (GIB, GIB - 32768 * 4096, True)
    assert sandbox.last_active == active and sandbox.in_flight == 0  # not activity
    assert set(vm.fake_guest.ops()) == {"resume", "set_clock", "read_file"}  # nothing started in the guest
    reads = [args["path"] for op, args in vm.fake_guest.calls if op == "read_file"]
    assert reads.count(MEMINFO) == 2 and reads.count(ROOT_SIZE) == 1 and reads.count(ROOT_GROUPS) == 1
    assert observer.series("sb-1", start=rig.clock() + 1).samples == []
    text = await observer.metrics_text()
    assert 'cryobox_sandbox_cpu_percent{sandbox="sb-1"} 25.0' in text


async def test_paused_and_hibernated_sandboxes_are_not_sampled_and_what_goes_is_forgotten(
    rig: Rig, tmp_path: Path
) -> None:
    vm = await running(rig, tmp_path, "sb-1", 4242)
    observer = observer_of(rig, tmp_path, interval_s=5.0)
    await observer.tick()
    rig.clock.advance(5.0)
    await observer.tick()
    assert len(observer.series("sb-1").samples) == 1
    await rig.service.pause("sb-1")
    reads = len(vm.fake_guest.calls)
    rig.clock.advance(5.0)
    await observer.tick()
    assert len(observer.series("sb-1").samples) == 1 and len(vm.fake_guest.calls) == reads  # history kept
    await rig.service.resume("sb-1")
    rig.clock.advance(100.0)
    fake_usage(tmp_path / "proc", 4242, utime=ticks(100.0), rss_kib=1)
    await observer.tick()  # a new baseline: the pause is not averaged in
    assert len(observer.series("sb-1").samples) == 1
    await rig.service.hibernate("sb-1")
    await observer.tick()
    assert len(observer.series("sb-1").samples) == 1
    await rig.service.delete("sb-1")
    await observer.tick()
    assert observer.series("sb-1").samples == [] and observer.page("sb-1", LogQuery()).entries == []


async def test_a_short_interval_samples_the_host_often_and_asks_the_guest_every_5_s(rig: Rig, tmp_path: Path) -> None:
    vm = await running(rig, tmp_path, "sb-1", 4242)
    observer = observer_of(rig, tmp_path, interval_s=1.0)
    for _ in range(11):
        await observer.tick()
        rig.clock.advance(1.0)
    assert len(observer.series("sb-1").samples) == 10
    reads = [args["path"] for op, args in vm.fake_guest.calls if op == "read_file"]
    assert reads.count(MEMINFO) == 3 and reads.count(ROOT_GROUPS) == 1  # at 0, 5 and 10 s; the disk once


async def test_the_guest_is_not_asked_while_a_capture_holds_the_sandbox(rig: Rig, tmp_path: Path) -> None:
    vm = await running(rig, tmp_path, "sb-1", 4242)
    observer = observer_of(rig, tmp_path)
    calls = len(vm.fake_guest.calls)
    async with rig.service.get("sb-1").lock:  # what a snapshot, a fork or a hibernation holds
        await observer.tick()
    assert len(vm.fake_guest.calls) == calls
    await observer.tick()
    assert len(vm.fake_guest.calls) > calls


async def test_a_guest_that_does_not_answer_gets_the_hosts_figures(rig: Rig, tmp_path: Path) -> None:
    await running(rig, tmp_path, "sb-1", 4242, guest=False)
    observer = observer_of(rig, tmp_path)
    await observer.tick()
    rig.clock.advance(5.0)
    await observer.tick()
    [sample] = observer.series("sb-1").samples
    assert sample.guest_view is False and sample.mem_total == 512 << 20 and sample.mem_used == 100_000 * 1024
    assert (sample.disk_total, sample.disk_used) == (0, 0)


async def test_the_log_has_the_console_and_the_agents_lines(rig: Rig, tmp_path: Path) -> None:
    vm = await running(rig, tmp_path, "sb-1", 4242)
    observer = observer_of(rig, tmp_path, console_bytes_per_tick=64)
    await rig.service.set_network("sb-1", EgressPolicy(allow=["example.org"]))
    vm.paths.console_log.write_bytes(b"hello from the guest\n")
    await observer.tick()
    with open(vm.paths.console_log, "ab") as out:
        out.write(b"x" * 200 + b"\nlast\n")
    await observer.tick()
    entries = observer.page("sb-1", LogQuery()).entries
    said = [(e.source, e.level, e.message) for e in entries]
    assert said[0][:2] == ("agent", "info") and said[0][2].startswith("started: restored from template base")
    assert ("agent", "info", "network policy changed: default deny; allow example.org") in said
    assert ("console", "info", "hello from the guest") in said
    assert any(s == "agent" and lvl == "warn" and "skipped" in m for s, lvl, m in said)
    assert said[-1] == ("console", "info", "last")


async def test_every_bound_holds(rig: Rig, tmp_path: Path) -> None:
    vm = await running(rig, tmp_path, "sb-1", 4242)
    observer = observer_of(rig, tmp_path, samples_per_sandbox=3, log_lines_per_sandbox=5)
    for i in range(8):
        with open(vm.paths.console_log, "ab") as out:
            out.write(f"line {i}\n".encode())
        await observer.tick()
        rig.clock.advance(1.0)
    series = observer.series("sb-1")
    assert len(series.samples) == 3 and series.dropped == 4
    page = observer.page("sb-1", LogQuery())
    assert [e.message for e in page.entries] == [f"line {i}" for i in range(3, 8)] and page.dropped == 4


async def test_the_loop_ticks_every_interval_until_closed(rig: Rig, tmp_path: Path) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(0)

    observer = SandboxObserver(
        rig.service, ObserveConfig(interval_s=2.5), clock=rig.clock, monotonic=rig.clock, sleep=sleep
    )
    observer.start()
    while observer.ticks < 3:
        await asyncio.sleep(0)
    await observer.close()
    assert slept[:3] == [2.5, 2.5, 2.5]
    await observer.close()  # idempotent


def test_the_interval_comes_from_the_environment() -> None:
    assert ObserveConfig.from_env({}).interval_s == 5.0
    assert ObserveConfig.from_env({INTERVAL_ENV: "0.5"}).interval_s == 0.5
    for bad in ("fast", "0", "99999"):
        with pytest.raises(InvalidArgument):
            ObserveConfig.from_env({INTERVAL_ENV: bad})
