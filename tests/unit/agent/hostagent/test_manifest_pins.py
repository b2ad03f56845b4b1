"""The agent's side of registry-pinned manifests (``agent/hostagent/snapshots.py``,
``agent/hostagent/hibernations.py``) over a file:// store and stand-in hosts: storing answers the sha256 of the
manifest uploaded; a restore or wake from the store with a pin imports only that manifest (``IntegrityError`` and
nothing installed otherwise)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cryobox.agent.hostagent.hibernations import HibernationOps
from cryobox.agent.hostagent.snapshots import SnapshotOps
from cryobox.agent.sandbox.admission import AdmissionConfig, AdmissionController
from cryobox.agent.sandbox.sandbox import SandboxState
from cryobox.agent.snapshot.store import SnapshotStore
from cryobox.agent.templates.bake import Template
from cryobox.agentapi import models as am
from cryobox.errors import IntegrityError
from cryobox.objstore.client import ObjectStore, open_store
from cryobox.objstore.pins import Pin
from tests.support.images import machine_config, make_hibernation, make_snapshot, make_template


def _host(root: Path, store: ObjectStore, template: Template, **service: Any) -> Any:
    snapshots = SnapshotStore(root / "snapshots", cast(Any, None), "qemu")
    hibernation = SnapshotStore(root / "hibernate", cast(Any, None), "qemu")
    svc = SimpleNamespace(template=lambda name: template, hibernation=hibernation, sandboxes={}, **service)
    return SimpleNamespace(store=store, snapshots=snapshots, service=svc)


def _swap_vmstate(store: ObjectStore, prefix: str) -> bytes:
    """A consistent replacement (object and its pin); returns the genuine manifest bytes."""
    genuine = store.get(f"{prefix}/manifest.json")
    manifest = json.loads(genuine)
    store.put(f"{prefix}/vmstate", b"evil")
    manifest["pins"][f"{prefix}/vmstate"] = Pin.of_bytes(b"evil").to_json()
    store.put(f"{prefix}/manifest.json", json.dumps(manifest).encode())
    return genuine


async def test_a_stored_snapshot_is_imported_elsewhere_only_with_the_manifest_it_was_stored_with(
    tmp_path: Path,
) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")
    make_snapshot(tmp_path / "a" / "snapshots", template_a, machine)
    ops_a = SnapshotOps(_host(tmp_path / "a", store, template_a), clock=lambda: 0.0)
    first, second = await asyncio.gather(ops_a.store("snap-1"), ops_a.store("snap-1"))  # one at a time
    pin = hashlib.sha256(store.get("snapshots/snap-1/manifest.json")).hexdigest()
    assert first == second and first.manifest_sha256 == pin

    host_b = _host(tmp_path / "b", store, template_b)
    ops_b = SnapshotOps(host_b, clock=lambda: 0.0)
    ref = am.SnapshotRef(id="snap-1", template="base", stored=True, manifest_sha256=pin)
    genuine = _swap_vmstate(store, "snapshots/snap-1")
    with pytest.raises(IntegrityError, match="registry pins"):
        await ops_b.restorable(ref)
    assert not host_b.snapshots.exists("snap-1") and host_b.snapshots.ids() == []

    store.put("snapshots/snap-1/manifest.json", genuine)
    store.put("snapshots/snap-1/vmstate", (tmp_path / "a" / "snapshots" / "snap-1" / "vmstate").read_bytes())
    image = await ops_b.restorable(ref)
    assert image.vmstate.read_bytes() == b"device state"
    again = await ops_b.store("snap-1")  # imported: it is in the store already, with the manifest it imported
    assert again.manifest_sha256 == pin


async def test_a_wake_from_the_store_refuses_a_manifest_other_than_the_pinned_one(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    machine = machine_config(tmp_path)
    template_a = make_template(tmp_path / "a" / "templates", machine, "g1")
    template_b = make_template(tmp_path / "b" / "templates", machine, "g1")
    image = make_hibernation(tmp_path / "a" / "hibernate", "sb-1.h1", template_a, machine, b"page")
    image = dataclasses.replace(image, manifest={**image.manifest, "size_bytes": 1})
    sandbox = SimpleNamespace(
        id="sb-1",
        template="base",
        lock=asyncio.Lock(),
        hibernation=image,
        state=SandboxState.HIBERNATED,
        volumes=(),
    )
    host_a = _host(tmp_path / "a", store, template_a, get=lambda sandbox_id: sandbox)
    host_a.service.sandboxes["sb-1"] = sandbox
    admission = AdmissionController(AdmissionConfig())
    stored = await HibernationOps(host_a, admission, info=lambda s: cast(Any, s)).store("sb-1")
    assert stored.manifest_sha256 == hashlib.sha256(store.get("hibernations/sb-1/manifest.json")).hexdigest()

    _swap_vmstate(store, "hibernations/sb-1")
    host_b = _host(tmp_path / "b", store, template_b)
    spec = am.WakeSpec(
        sandbox_id="sb-1",
        template="base",
        workspace_id="ws",
        created_at=1.0,
        instance_id="i-1",
        manifest_sha256=stored.manifest_sha256,
    )
    with pytest.raises(IntegrityError, match="hibernation of sb-1"):
        await HibernationOps(host_b, admission, info=lambda s: cast(Any, s)).wake_stored(spec)
    root = tmp_path / "b" / "hibernate"
    assert host_b.service.sandboxes == {} and (not root.exists() or list(root.iterdir()) == [])
    assert admission.running == 0
