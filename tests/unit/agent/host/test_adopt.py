"""The pieces a restarted agent re-adopts VMs with: records, process identity, reclaim that spares, slot
adoption, hot-copy and firewall grants kept, and crash points."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.crashpoints import CrashPoints
from cryobox.agent.host.adopt import survey
from cryobox.agent.host.reclaim import reclaim
from cryobox.agent.memory.hot import HotImages
from cryobox.agent.net.pool import IndexAllocator, SlotPool
from cryobox.agent.net.slots import SlotPlan
from cryobox.agent.sandbox.records import SandboxRecord, SandboxRecords, VmRecord
from cryobox.errors import InvalidArgument, StateError
from cryobox.util.procfs import process_start_ticks
from tests.support.net import FakeBuilder
from tests.support.procfs import QEMU, fake_proc_entry

PLAN = SlotPlan("0a1b2c", "10.23.0.0/16")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "60"])
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


def _vm(pid: int, ticks: int, root: Path, slot: int | None = 3) -> VmRecord:
    return VmRecord(
        vm_id=root.name,
        pid=pid,
        start_ticks=ticks,
        root=str(root),
        disk=str(root / "disk.qcow2"),
        memory_path="/dev/shm/x/tpl-base-1/memory",
        memory_share=False,
        write_trackable=True,
        machine={"memory_mib": 512},
        netns=f"cryobox-0a1b2c-{slot}",
        slot_index=slot,
        slot_cidr=PLAN.cidr,
    )


def test_records_round_trip_and_corrupt_files_are_set_aside(tmp_path: Path) -> None:
    records = SandboxRecords(tmp_path / "sandboxes")
    vm = _vm(123, 456, tmp_path / "run" / "vm-a")
    record = SandboxRecord(
        id="sb-1",
        template="base",
        cpus=1,
        memory_mib=512,
        state="running",
        created_at=1.5,
        metadata={"k": "v"},
        egress=["10.0.0.0/8"],
        vm=vm,
    )
    records.write(record)
    records.write(SandboxRecord(id="sb-2", template="base", cpus=1, memory_mib=512, state="hibernated", created_at=2))
    (records.root / "sb-3.json").write_text("{not json")
    (records.root / ".sb-4.json.tmp99").write_text("half")  # a write that never finished
    loaded = {r.id: r for r in records.load_all()}
    assert loaded["sb-1"] == record and loaded["sb-1"].vm == vm
    assert loaded["sb-2"].vm is None and set(loaded) == {"sb-1", "sb-2"}
    assert (records.root / "sb-3.bad").exists() and not (records.root / ".sb-4.json.tmp99").exists()
    records.remove("sb-1")
    records.remove("sb-1")  # idempotent
    assert [r.id for r in records.load_all()] == ["sb-2"]


def test_process_identity_is_pid_and_start_time(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    ticks = process_start_ticks(sleeper.pid)
    assert ticks is not None and ticks == process_start_ticks(sleeper.pid)
    assert _vm(sleeper.pid, ticks, tmp_path / "vm").alive()
    assert not _vm(sleeper.pid, ticks + 1, tmp_path / "vm").alive(), "a reused pid is not the recorded VM"
    sleeper.kill()
    sleeper.wait()
    assert process_start_ticks(sleeper.pid) is None
    assert not _vm(sleeper.pid, ticks, tmp_path / "vm").alive()


def test_survey_sorts_live_hibernated_and_lost(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    records = SandboxRecords(tmp_path / "sandboxes")
    ticks = process_start_ticks(sleeper.pid)
    assert ticks is not None
    image = tmp_path / "hibernate" / "sb-h.habc"
    image.mkdir(parents=True)
    (image / "manifest.json").write_text("{}")
    base = {"template": "base", "cpus": 1, "memory_mib": 512, "created_at": 1.0}
    records.write(SandboxRecord(id="live", state="running", vm=_vm(sleeper.pid, ticks, run_dir / "vm-1"), **base))  # type: ignore[arg-type]
    records.write(SandboxRecord(id="dead", state="paused", vm=_vm(sleeper.pid, ticks + 7, run_dir / "vm-2"), **base))  # type: ignore[arg-type]
    elsewhere = _vm(sleeper.pid, ticks, tmp_path / "other-run" / "vm-3")
    records.write(SandboxRecord(id="foreign", state="running", vm=elsewhere, **base))  # type: ignore[arg-type]
    records.write(SandboxRecord(id="hib", state="hibernated", hibernation=str(image), **base))  # type: ignore[arg-type]
    records.write(SandboxRecord(id="torn", state="hibernated", hibernation=str(tmp_path / "nope"), **base))  # type: ignore[arg-type]
    found = survey(records, run_dir)
    assert [r.id for r in found.live] == ["live"]
    assert [r.id for r in found.hibernated] == ["hib"]
    assert sorted(r.id for r in found.lost) == ["dead", "foreign", "torn"]
    assert found.keep_vms() == {"vm-1": sleeper.pid}
    assert found.slot_cidr() == PLAN.cidr and [s.index for s in found.slots(PLAN)] == [3]
    assert found.hibernation_dirs() == {"sb-h.habc"}
    hot = HotImages(Path("/dev/shm/x"))
    assert found.hot_keys(hot) == {"tpl-base-1"}


def test_reclaim_spares_kept_vms(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    run_dir = tmp_path / "run"
    proc = tmp_path / "proc"
    fake_proc_entry(proc, sleeper.pid, [QEMU, "-pidfile", f"{run_dir}/vm-1/qemu.pid"])
    (run_dir / "vm-1").mkdir(parents=True)
    (run_dir / "vm-2").mkdir()
    assert reclaim(run_dir, proc, keep={"vm-1": sleeper.pid}) == 0
    assert sleeper.poll() is None
    assert sorted(p.name for p in run_dir.iterdir()) == ["vm-1"]


def test_index_claim_and_slot_adoption() -> None:
    indices = IndexAllocator(8)
    indices.claim(3)
    assert [indices.take() for _ in range(4)] == [0, 1, 2, 4]
    with pytest.raises(StateError):
        indices.claim(3)
    indices.claim(5)
    assert indices.take() == 6


async def test_an_adopted_slot_is_leased_never_rebuilt_and_released_normally() -> None:
    builder = FakeBuilder()
    pool = SlotPool(PLAN, size=2, builder=builder)
    slot = pool.adopt(0)
    assert pool.stats().leased == 1
    await pool.wait_warm()
    assert 0 not in builder.created, "the adopted slot's index is never built again"
    await pool.release(slot)
    assert pool.stats().recycled == 1
    other = pool.adopt(5)
    idle = set(builder.live)
    destroyed = list(builder.destroyed)
    await pool.detach()  # --on-stop keep: nothing is destroyed (the next agent's pool reclaims the idle ones)
    assert other.index not in builder.destroyed and builder.destroyed == destroyed and builder.live == idle
    await pool.close()


async def test_leftover_slots_are_destroyed_in_the_background_and_never_handed_out_before() -> None:
    """A killed agent's pre-built slots are reclaimed by the next one's pool after it starts (not in its start-up):
    their indices are built again only once destroyed; a pool closed first destroys the rest (a kill stop)."""
    builder = FakeBuilder()
    held = threading.Event()
    destroy = builder.destroy
    builder.destroy = lambda slot: (held.wait(10), destroy(slot))[1]  # type: ignore[method-assign]
    pool = SlotPool(PLAN, size=2, builder=builder)
    pool.adopt(0)
    pool.reclaim_later([1, 2])
    await pool.wait_warm()  # while the leftovers are being destroyed: other indices
    assert builder.created == [3, 4] and builder.destroyed == []
    held.set()
    for _ in range(500):
        if builder.destroyed == [1, 2]:
            break
        await asyncio.sleep(0.01)
    assert builder.destroyed == [1, 2]
    slot = await pool.acquire()
    await pool.acquire()
    assert slot.index == 3 and (await pool.acquire()).index in (1, 2)  # a reclaimed index is free again
    await pool.close()

    closing = FakeBuilder()
    early = SlotPool(PLAN, size=0, builder=closing)
    early.reclaim_later([3, 7])
    await early.close()  # never started: a kill stop still leaves none of them
    assert sorted(closing.destroyed) == [3, 7] and closing.created == []

    kept = FakeBuilder()
    keep = SlotPool(PLAN, size=0, builder=kept)
    keep.reclaim_later([4])
    await keep.detach()  # a keep stop before it started: left on the host for the next agent
    assert kept.destroyed == []


def test_hot_wipe_keeps_what_adopted_vms_map(tmp_path: Path) -> None:
    hot = HotImages(tmp_path / "hot")
    for key in ("tpl-base-1", "snap-1", "vm-9"):
        hot.path(key).parent.mkdir(parents=True)
        hot.path(key).write_bytes(b"ram")
    hot.wipe(keep={"tpl-base-1", "vm-9"})
    assert sorted(p.name for p in hot.root.iterdir()) == ["tpl-base-1", "vm-9"]
    assert hot.key_of(hot.path("vm-9")) == "vm-9" and hot.key_of(tmp_path / "memory") is None
    hot.wipe()
    assert list(hot.root.iterdir()) == []


def test_crash_points(monkeypatch: pytest.MonkeyPatch) -> None:
    kills: list[int] = []
    points = CrashPoints.from_env({"CRYOBOX_CRASH_AT": "create.restored:2"})
    points.kill = lambda: kills.append(os.getpid())
    points("create.spawned")
    points("create.restored")
    assert kills == []
    points("create.restored")
    points("create.restored")
    assert len(kills) == 1
    assert CrashPoints.from_env({}).step == ""
    for bad in ("nope", "create.restored:0", "create.restored:x"):
        with pytest.raises(InvalidArgument):
            CrashPoints.from_env({"CRYOBOX_CRASH_AT": bad})


def test_crash_file_arms_any_step_at_run_time(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    points = CrashPoints.from_env({"CRYOBOX_CRASH_FILE": str(arm)})
    kills: list[str] = []
    points.kill = lambda: kills.append("x")
    points("delete.killed")
    arm.write_text("wake.spawned\n")
    points("delete.killed")
    assert kills == []
    points("wake.spawned")
    assert kills == ["x"]
