"""One vocabulary for a sandbox's three shapes (``agent/sandbox/mapping.py``): every field the durable record,
the reported info and a stored wake's spec share with the live Sandbox has its name (and unit) there; a record
round-trips through adoption; a record as an earlier version wrote it still loads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cryobox.agent.sandbox.mapping import adopted_sandbox, fork_child, sandbox_info, sandbox_record, stored_wake
from cryobox.agent.sandbox.records import SandboxRecord, SandboxRecords
from cryobox.agent.sandbox.sandbox import Sandbox, SandboxState
from cryobox.agent.snapshot.store import SnapshotImage
from cryobox.agent.vm import VmState
from cryobox.agentapi import models as am
from cryobox.netpolicy import EgressPolicy
from cryobox.util.sealing import Sealer
from tests.support.fake_vm import MACHINE, FakeFactory

SANDBOX_FIELDS = {f.name for f in dataclasses.fields(Sandbox)}
SANDBOX_PROPERTIES = {"expires_at", "guest_ip"}


def test_the_record_info_and_wake_spec_speak_the_sandboxs_vocabulary() -> None:
    record_only = {"vm", "state", "hibernation"}  # the VM's own record, the state's value, the image's path
    assert {f.name for f in dataclasses.fields(SandboxRecord)} - record_only <= SANDBOX_FIELDS
    computed = {"idle_s", "expired", "vm_id"}  # Sandbox.idle_s(now), Sandbox.expired(now), Sandbox.vm.vm_id
    assert set(am.SandboxInfo.model_fields) - computed <= SANDBOX_FIELDS | SANDBOX_PROPERTIES
    assert set(am.WakeSpec.model_fields) - {"sandbox_id", "manifest_sha256"} <= SANDBOX_FIELDS


def _sandbox(factory: FakeFactory) -> Sandbox:
    return Sandbox(
        id="sb-1",
        template="base",
        cpus=2,
        memory_mib=512,
        vm=factory._make(MACHINE, VmState.RUNNING),
        created_at=10.0,
        boot_ms=12.5,
        state=SandboxState.PAUSED,
        workspace_id="ws",
        metadata={"k": "v"},
        env={"E": "1"},
        persistent=True,
        ttl_s=60,
        last_active=20.0,
        from_snapshot="snap-1",
        instance_id="inst",
        egress=EgressPolicy(allow=["10.0.0.0/8", "example.org"]),
        mapped_image="sb-1.h1",
    )


def test_a_record_round_trips_through_adoption(tmp_path: Path) -> None:
    factory = FakeFactory(tmp_path)
    sandbox = _sandbox(factory)
    record = sandbox_record(sandbox, factory.vm_record(sandbox.vm))
    assert (record.state, record.memory_mib, record.ttl_s, record.mapped_image) == ("paused", 512, 60, "sb-1.h1")
    adopted = adopted_sandbox(record, sandbox.vm, 99.0, state=SandboxState.PAUSED)
    assert sandbox_record(adopted, record.vm) == record
    assert adopted.adopted and adopted.last_active == 99.0  # a restart grants a fresh idle period
    assert adopted.egress == sandbox.egress and adopted.metadata is not record.metadata  # copies, not shared
    assert record.egress == {**EgressPolicy().model_dump(mode="json"), "allow": ["10.0.0.0/8", "example.org"]}


def test_info_reports_the_sandbox_at_a_time(tmp_path: Path) -> None:
    sandbox = _sandbox(FakeFactory(tmp_path))
    sandbox.state, sandbox.persistent, sandbox.instance_id = SandboxState.RUNNING, False, ""
    info = sandbox_info(sandbox, now=50.0)
    assert (info.memory_mib, info.cpus, info.ttl_s, info.created_at) == (512, 2, 60, 10.0)
    assert (info.state, info.vm_id, info.instance_id) == ("running", sandbox.vm.vm_id, None)
    assert (info.expires_at, info.idle_s, info.expired) == (80.0, 30.0, False)
    assert sandbox_info(sandbox, now=81.0).expired


def test_a_fork_child_and_a_stored_wake_take_what_they_should(tmp_path: Path) -> None:
    factory = FakeFactory(tmp_path)
    parent = _sandbox(factory)
    child = fork_child(
        parent, "sb-2", factory._make(MACHINE, VmState.RUNNING), 30.0, metadata={"m": "1"}, instance_id="i2", slot=None
    )
    assert (child.template, child.cpus, child.memory_mib, child.workspace_id) == ("base", 2, 512, "ws")
    assert (child.env, child.egress, child.metadata, child.boot_mode) == (
        {"E": "1"},
        EgressPolicy(allow=["10.0.0.0/8", "example.org"]),
        {"m": "1"},
        "cold",
    )
    assert (child.ttl_s, child.persistent, child.from_snapshot, child.state) == (
        None,
        False,
        None,
        SandboxState.STARTING,
    )

    image = SnapshotImage("sb-9.h1", tmp_path / "img", MACHINE, {"template": "base"})
    spec = am.WakeSpec(
        sandbox_id="sb-9",
        template="base",
        workspace_id="ws",
        created_at=3.0,
        instance_id="i9",
        ttl_s=5,
        egress=[],  # type: ignore[arg-type]
    )
    woken = stored_wake(spec, image, factory.placeholder("sb-9", MACHINE), 40.0)
    assert (woken.id, woken.state, woken.hibernation, woken.memory_mib) == ("sb-9", SandboxState.HIBERNATED, image, 512)
    # a list of CIDRs (a control plane of before policies) reads as a policy allowing exactly those
    assert (woken.instance_id, woken.ttl_s, woken.egress, woken.last_active) == ("i9", 5, EgressPolicy(), 40.0)


def test_a_record_an_earlier_version_wrote_still_loads(tmp_path: Path) -> None:
    records = SandboxRecords(tmp_path / "sandboxes", sealer=Sealer.ephemeral())
    records.root.mkdir(parents=True)
    written = {  # the keys and units a record has always had on disk (env in plain text before sealing)
        "version": 1,
        "id": "sb-old",
        "template": "base",
        "cpus": 1,
        "memory_mib": 256,
        "state": "hibernated",
        "created_at": 1.5,
        "workspace_id": "ws",
        "boot_mode": "restore",
        "boot_ms": 3.0,
        "metadata": {},
        "env": {"E": "1"},
        "persistent": False,
        "ttl_s": 30,
        "from_snapshot": None,
        "instance_id": "i",
        "egress": ["10.0.0.0/8"],  # before policies: the CIDRs the guest may reach
        "vm": None,
        "hibernation": "/data/vol/hibernate/sb-old.h1",
        "mapped_image": None,
    }
    (records.root / "sb-old.json").write_text(json.dumps(written))
    [record] = records.load_all()
    assert (record.memory_mib, record.ttl_s, record.env, record.hibernation) == (
        256,
        30,
        {"E": "1"},
        written["hibernation"],
    )
    placeholder = FakeFactory(tmp_path).placeholder("sb-old", MACHINE)
    adopted = adopted_sandbox(record, placeholder, 5.0, state=SandboxState.HIBERNATED)
    assert adopted.egress == EgressPolicy(allow=["10.0.0.0/8"])
    stored = json.loads((records.root / "sb-old.json").read_text())  # sealed now, every other key as it was
    assert set(stored) == set(written) and {k: v for k, v in stored.items() if k != "env"} == {
        k: v for k, v in written.items() if k != "env"
    }
