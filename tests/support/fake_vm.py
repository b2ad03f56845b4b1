"""Stand-ins for the VM layer under :class:`~cryobox.agent.sandbox.service.SandboxService` and
:class:`~cryobox.agent.sandbox.forking.Forking`: no QEMU, no root, no network.

- :class:`FakeVm` is a :class:`~cryobox.agent.vm.MicroVM` whose QMP and process are simulated: it keeps the real
  state guards (``restore`` needs ``incoming``, ``pause`` needs ``running``, ``resume`` needs ``paused``), records
  every QMP command (``qmp_log``; ``qmp_errors`` makes one fail) and has a guest agent (:class:`FakeGuest`) that
  answers ``resume`` (mounting the volumes it names)/``set_clock``/``exec``/files/``volumes_settle`` and
  ``volumes_release``/``volumes_mount`` (``mounted``: what it has mounted; ``busy``: paths it cannot release) only
  while it runs.
- :class:`FakeFactory` makes them (restores, cold boots, adoptions, placeholders) and records what it destroyed
  and which egress it granted; ``rejoin_error`` makes the guests it makes from then on fail to rejoin.
- :class:`FakeImageStore` is a real :class:`~cryobox.agent.snapshot.store.SnapshotStore` directory (load, delete,
  ids are the real ones) whose captures write a small image instead of reading a VM's RAM.
- :class:`StepLog` records every crash point reached with the durable records' states at that moment.

:func:`make_rig` builds a service over these, with real durable records (:class:`SandboxRecords`) on disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cryobox.agent.crashpoints import CrashPoints
from cryobox.agent.guest.client import GuestClient
from cryobox.agent.memory.hot import HotImages
from cryobox.agent.net.slots import Slot
from cryobox.agent.sandbox.factory import RestoreSource, VmFactory
from cryobox.agent.sandbox.forking import Forking
from cryobox.agent.sandbox.mapping import vm_record
from cryobox.agent.sandbox.records import SandboxRecords, VmRecord
from cryobox.agent.sandbox.service import SandboxService
from cryobox.agent.snapshot.store import CaptureInfo, SnapshotImage, SnapshotStore
from cryobox.agent.templates.bake import Template
from cryobox.agent.vm import Accel, MachineConfig, MemoryBacking, MicroVM, VmPaths, VmState
from cryobox.agent.vm.states import require
from cryobox.errors import GuestError, VmmError
from cryobox.netpolicy import EgressPolicy
from cryobox.util.encoding import b64, unb64
from cryobox.util.sealing import Sealer
from tests.support.clock import FakeClock

MACHINE = MachineConfig(512, 2, Accel.TCG, Path("/k"), Path("/i"), 1, True)


class FakeGuest:
    """A guest agent that answers while its VM runs (a paused guest cannot answer)."""

    def __init__(self, vm: FakeVm) -> None:
        self.vm = vm
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.files: dict[str, bytes] = {}
        self.closed = False
        self.mounted: set[str] = set()
        self.busy: set[str] = set()
        """Mount paths a ``volumes_release`` finds in use (EBUSY)."""

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]

    async def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None, max_reply: int = 0
    ) -> dict[str, Any]:
        args = dict(args or {})
        self.calls.append((op, args))
        if self.vm.state is not VmState.RUNNING:
            raise GuestError(f"the guest of {self.vm.vm_id} does not answer ({self.vm.state.value})")
        if op == "resume":
            errors = {"clock": self.vm.rejoin_error} if self.vm.rejoin_error else {}
            reply = {"step_ns": 0, "instance_id": args["instance_id"], "reseeded": True, "hooks": [], "errors": errors}
            if "volumes" in args:
                reply["volumes"] = self._mount(args["volumes"])
            return reply
        if op == "volumes_settle":
            return {"settled": {p: "frozen" for p in args["paths"]}, "errors": {}}
        if op == "volumes_mount":
            return {"volumes": self._mount(args["volumes"])}
        if op == "volumes_release":
            return self._release(args["volumes"])
        if op == "set_clock":
            return {"before_ns": args["epoch_ns"]}
        if op == "exec":
            out = json.dumps({"cmd": args["cmd"], "env": args["env"]}).encode()
            return {"exit_code": 0, "stdout": b64(out), "stderr": "", "duration_ms": 1.0}
        if op == "write_file":
            data = unb64(args["content"])
            self.files[args["path"]] = data
            return {"path": args["path"], "bytes": len(data)}
        if op == "read_file":
            return {"content": b64(self.files[args["path"]])}
        return {}

    async def post(self, op: str, args: dict[str, Any], timeout: float) -> None:
        """Sent, its reply not waited for (as :meth:`GuestClient.post`): recorded like a call, a failure dropped."""
        with contextlib.suppress(GuestError):
            await self.call(op, args)

    def _mount(self, volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = []
        for v in volumes:
            ok = v["path"] not in self.vm.unmountable
            results.append({"path": v["path"], "device": v["device"], "ok": ok, "ms": 1.0})
            if ok:
                self.mounted.add(v["path"])
        return results

    def _release(self, volumes: list[dict[str, Any]]) -> dict[str, Any]:
        for v in volumes:
            if v["path"] in self.busy:
                return {"ok": False, "step": "umount", "path": v["path"], "device": v["device"], "error": "EBUSY: x"}
        released = [v["path"] for v in volumes if v["path"] in self.mounted]
        self.mounted -= set(released)
        return {"ok": True, "released": released, "ms": 1.0}


class FakeVm(MicroVM):
    """A MicroVM without QEMU: states and guards as the real one, a :class:`FakeGuest` for its agent."""

    def __init__(self, vm_id: str, config: MachineConfig, run_dir: Path, state: VmState, rejoin_error: str) -> None:
        root = run_dir / vm_id
        root.mkdir(parents=True, exist_ok=True)
        (root / "disk.qcow2").write_bytes(f"disk of {vm_id}".encode())
        super().__init__(vm_id, config, VmPaths(root), MemoryBacking(root / "memory", share=False), root / "disk.qcow2")
        self.state = state
        self.rejoin_error = rejoin_error
        self.restored_from: Path | None = None
        self.detached = False
        self.fake_guest = FakeGuest(self)
        self._pid = 1000 + len(vm_id)
        self.start_ticks = 7
        self.qmp_log: list[tuple[str, dict[str, Any]]] = []
        self.qmp_errors: dict[str, str] = {}
        """command -> the error QMP answers it with."""
        self.unmountable: set[str] = set()
        """Mount paths the guest fails to mount."""
        self._fdsets = 0

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        self.qmp_log.append((command, dict(arguments or {})))
        if command in self.qmp_errors:
            raise VmmError(f"QMP {command} failed: {self.qmp_errors[command]}")
        if command == "add-fd":
            if "fdset-id" in (arguments or {}):
                return {"fdset-id": arguments["fdset-id"]}  # type: ignore[index]
            self._fdsets += 1
            return {"fdset-id": self._fdsets}
        return {}

    def stage_fd(self, fd: int, opaque: str) -> tuple[int, tuple[str, dict[str, Any]]]:
        os.fstat(fd)  # a descriptor that is open
        self._fdsets += 1
        fdset = (1 << 20) + self._fdsets
        return fdset, ("add-fd", {"fdset-id": fdset, "opaque": opaque})

    async def add_fd(self, fd: int, opaque: str) -> int:
        os.fstat(fd)  # a descriptor that is open
        return int((await self.execute("add-fd", {"opaque": opaque}))["fdset-id"])

    def qmp_commands(self) -> list[str]:
        return [command for command, _ in self.qmp_log]

    def alive(self) -> bool:
        return self.state.alive

    @require(VmState.INCOMING)
    async def restore(
        self, vmstate: Path, timeout: float = 60.0, *, prepare: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        self.restored_from = vmstate
        if prepare is not None:
            await prepare()
        self.state = VmState.RUNNING

    @require(VmState.RUNNING)
    async def pause(self) -> None:
        self.state = VmState.PAUSED

    @require(VmState.PAUSED)
    async def resume(self) -> None:
        self.state = VmState.RUNNING

    async def connect_guest(self, timeout: float = 10.0) -> GuestClient:
        if not self.state.alive:
            raise VmmError(f"VM {self.vm_id} has no QEMU")
        return cast(GuestClient, self.fake_guest)

    async def wait_guest_ready(self, timeout: float, ping_timeout: float = 0.5) -> dict[str, Any]:
        if self.state is not VmState.RUNNING:
            raise GuestError(f"guest agent did not answer within {timeout:.0f}s")
        return {}

    async def kill(self) -> None:
        self.state = VmState.KILLED

    async def detach(self) -> None:
        self.detached = True
        self.state = VmState.KILLED


class FakeFactory:
    """Makes :class:`FakeVm` s the way :class:`~cryobox.agent.sandbox.factory.VmFactory` makes MicroVMs."""

    def __init__(self, root: Path) -> None:
        self.run_dir = root / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.hot = HotImages(root / "hot")
        self.made: list[FakeVm] = []
        self.destroyed: list[str] = []
        self.egress: dict[str, EgressPolicy | None] = {}
        self.forgotten: list[str] = []
        self.cold_disks: list[bytes] = []
        """What each cold-booted VM's disk held when it was spawned."""
        self.rejoin_error = ""
        """Non-empty: the guests of VMs made from now on fail their rejoin with this message."""
        self.background: dict[str, bool] = {}
        """Each VM's CPU weight as the pool last set it (``True``: small, while it warms)."""

    def _make(self, config: MachineConfig, state: VmState, prefix: str = "vm") -> FakeVm:
        vm = FakeVm(f"{prefix}-{len(self.made) + 1}", config, self.run_dir, state, self.rejoin_error)
        self.made.append(vm)
        return vm

    async def spawn_incoming(self, source: RestoreSource, *, lazy: bool = False) -> MicroVM:
        return self._make(source.machine, VmState.INCOMING)

    async def spawn_cold(self, machine: MachineConfig, disk: Path) -> MicroVM:
        self.cold_disks.append(disk.read_bytes())
        return self._make(machine, VmState.RUNNING)

    async def warm(self, vm: MicroVM, template: Template) -> None:
        pass

    def slot_of(self, vm: MicroVM) -> Slot | None:
        return None

    async def apply_egress(self, vm: MicroVM, sandbox_id: str, policy: EgressPolicy | None) -> None:
        self.egress[vm.vm_id] = policy

    async def forget_egress(self, sandbox_id: str) -> None:
        self.forgotten.append(sandbox_id)

    def vm_record(self, vm: MicroVM) -> VmRecord:
        return vm_record(vm, None, None)

    async def adopt(self, record: VmRecord) -> MicroVM:
        return self._make(MachineConfig.from_json(record.machine), VmState.RUNNING, prefix="adopted")

    def placeholder(self, sandbox_id: str, machine: MachineConfig) -> MicroVM:
        return self._make(machine, VmState.KILLED, prefix=f"vm-{sandbox_id}-hibernated")

    async def explain_failure(self, vm: MicroVM) -> None:
        return None

    def set_background(self, vm: Any, background: bool) -> None:
        self.background[vm.vm_id] = background

    async def destroy(self, vm: MicroVM) -> None:
        await vm.kill()
        self.destroyed.append(vm.vm_id)


class FakeImageStore(SnapshotStore):
    """A real store directory whose captures write a small image (and leave the VM as a capture would)."""

    def __init__(self, root: Path, hot: HotImages) -> None:
        super().__init__(root, hot, "QEMU emulator version 0.0 (fake)")
        self.finish_error: Exception | None = None
        self.mounted_at_capture: dict[str, set[str]] = {}
        """Snapshot id -> what the guest of the VM captured had mounted then."""

    async def begin(
        self, vm: MicroVM, snapshot_id: str, info: CaptureInfo, *, keep_running: bool = True
    ) -> SnapshotImage:
        path = self.root / snapshot_id
        path.mkdir(parents=True)
        if isinstance(vm, FakeVm):
            self.mounted_at_capture[snapshot_id] = set(vm.fake_guest.mounted)
        for name, data in (("memory", b"ram"), ("vmstate", b"devices"), ("disk.qcow2", vm.disk.read_bytes())):
            (path / name).write_bytes(data)
        manifest = {
            "id": snapshot_id,
            "parent": info.parent_id,
            "template": info.template,
            "sandbox_id": info.sandbox_id,
            "workspace_id": info.workspace_id,
            "labels": dict(info.labels or {}),
            "machine": vm.config.to_json(),
            "created_at": time.time(),
            "size_bytes": 3,
            "capture": {"pause_ms": 1.0, "total_ms": 2.0},
        }
        (path / "manifest.json").write_text(json.dumps(manifest))
        if not keep_running:
            vm.state = VmState.SAVED
        return SnapshotImage(snapshot_id, path, vm.config, manifest)

    async def finish(self, image: SnapshotImage) -> SnapshotImage:
        if self.finish_error is not None:
            self.delete(image.id)
            raise self.finish_error
        return image

    async def capture(
        self, vm: MicroVM, snapshot_id: str, info: CaptureInfo, *, keep_running: bool = True
    ) -> SnapshotImage:
        return await self.finish(await self.begin(vm, snapshot_id, info, keep_running=keep_running))


def record_states(records: SandboxRecords) -> dict[str, str]:
    """Every durable record's state, by sandbox id, read as they are (``load_all`` would also sweep the temp files
    of writes in progress: it runs at start, when there are none)."""
    if not records.root.is_dir():
        return {}
    paths = (p for p in records.root.glob("*.json") if not p.name.startswith("."))
    return {p.stem: str(json.loads(p.read_text())["state"]) for p in sorted(paths)}


class StepLog(CrashPoints):
    """Crash points that never crash: each step reached, with every durable record's state at that moment."""

    def __init__(self, records: SandboxRecords) -> None:
        super().__init__()
        self.records = records
        self.steps: list[tuple[str, dict[str, str]]] = []

    def __call__(self, step: str) -> None:
        self.steps.append((step, record_states(self.records)))

    def names(self) -> list[str]:
        return [step for step, _ in self.steps]


@dataclass
class Rig:
    service: SandboxService
    factory: FakeFactory
    hibernation: FakeImageStore
    snapshots: FakeImageStore
    forking: Forking
    records: SandboxRecords
    steps: StepLog
    template: Template
    clock: FakeClock

    def vm(self, sandbox_id: str) -> FakeVm:
        vm = self.service.get(sandbox_id).vm
        assert isinstance(vm, FakeVm)
        return vm

    def recorded(self) -> dict[str, str]:
        """Every durable record's state, by sandbox id."""
        return record_states(self.records)


SLOTTED = dataclasses.replace(MACHINE, rw_volume_slots=2, ro_volume_slots=2)
"""A machine with two read-write and two read-only volume slots (the ``vols`` template of :func:`with_volume_slots`)."""


def make_template(root: Path, name: str = "base", machine: MachineConfig = MACHINE) -> Template:
    path = root / "templates" / f"{name}-g1"
    path.mkdir(parents=True)
    (path / "vmstate").write_bytes(b"template devices")
    return Template(name, "g1", path, machine, {"created_at": 1.0})


def with_volume_slots(rig: Rig, root: Path) -> Rig:
    """``rig`` serving template ``vols`` too, baked with volume slots (:data:`SLOTTED`)."""
    rig.service.add_template(make_template(root, "vols", SLOTTED))
    return rig


def blank_image(root: Path, name: str, content: bytes = b"") -> Path:
    """A 1 MiB file starting with ``content``: a volume's image as far as fake VMs care."""
    path = root / name
    with open(path, "wb") as fh:
        fh.write(content)
        fh.truncate(1 << 20)
    return path


def make_rig(root: Path) -> Rig:
    factory = FakeFactory(root)
    hibernation = FakeImageStore(root / "vol" / "hibernate", factory.hot)
    snapshots = FakeImageStore(root / "vol" / "snapshots", factory.hot)
    records = SandboxRecords(root / "vol" / "sandboxes", sealer=Sealer.ephemeral())
    steps = StepLog(records)
    template = make_template(root)
    clock = FakeClock(1000.0)
    service = SandboxService(
        {template.name: template},
        cast(VmFactory, factory),
        hibernation,
        prespawn=0,  # no pool refills in the background: every create spawns inline
        clock=clock,
        records=records,
        crash=steps,
    )
    forking = Forking(service, snapshots)
    return Rig(service, factory, hibernation, snapshots, forking, records, steps, template, clock)
