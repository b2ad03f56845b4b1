"""One sandbox in its three shapes, with one vocabulary: the live :class:`~.sandbox.Sandbox`, its durable
:class:`~.records.SandboxRecord`, and the :class:`~cryobox.agentapi.models.SandboxInfo` the agent reports.

Every field that crosses from one shape to another keeps its name and unit (``cpus``, ``memory_mib``, ``ttl_s``,
``created_at`` and ``last_active`` in epoch seconds, ``boot_ms``, ``instance_id``, ``egress``, …), and this module
is the only place that copies them field by field: a record written, a sandbox adopted from its record, the info
reported, a fork child made from its parent, a sandbox hibernated elsewhere taken in from its ``WakeSpec``, and
its QEMU's record (:func:`vm_record`). A record's JSON keys are its field names, so records written by earlier
versions load unchanged.
"""

from __future__ import annotations

from typing import Any

from ...agentapi import models as am
from ...errors import VmmError
from ...netpolicy import EgressPolicy, legacy_policy
from ..net.netlink import slot_rules_digest
from ..net.slots import Slot
from ..snapshot.store import SnapshotImage
from ..vm import MicroVM
from ..vm.volumes import AttachedVolume
from .records import SandboxRecord, VmRecord
from .sandbox import Sandbox, SandboxState


def _stored(policy: EgressPolicy | None) -> dict[str, Any] | None:
    return policy.model_dump(mode="json") if policy is not None else None


def _policy(stored: object) -> EgressPolicy | None:
    """A record's policy (a list of CIDRs from before policies reads as a policy allowing exactly those)."""
    return EgressPolicy.model_validate(legacy_policy(stored)) if stored is not None else None


def vm_record(vm: MicroVM, slot: Slot | None, slot_cidr: str | None) -> VmRecord:
    """What a later agent needs to adopt ``vm``, on ``slot`` of the plan ``slot_cidr`` (see :mod:`.records`)."""
    if vm.pid is None or vm.start_ticks is None:
        raise VmmError(f"VM {vm.vm_id} has no process to record")
    return VmRecord(
        vm_id=vm.vm_id,
        pid=vm.pid,
        start_ticks=vm.start_ticks,
        root=str(vm.paths.root),
        disk=str(vm.disk),
        memory_path=str(vm.memory.path),
        memory_share=vm.memory.share,
        write_trackable=vm.memory.write_trackable,
        memory_origin=str(vm.memory.origin) if vm.memory.origin is not None else None,
        machine=vm.config.to_json(),
        netns=vm.net.netns if vm.net is not None else None,
        tap=vm.net.tap if vm.net is not None else "tap0",
        slot_index=slot.index if slot is not None else None,
        slot_cidr=slot_cidr if slot is not None else None,
        uid=vm.jail.uid if vm.jail is not None else None,
        slot_rules=slot_rules_digest(slot) if slot is not None else None,
    )


def sandbox_record(sandbox: Sandbox, vm: VmRecord | None) -> SandboxRecord:
    """The durable record of ``sandbox``; ``vm``: its QEMU's record (``None`` unless it is live)."""
    return SandboxRecord(
        id=sandbox.id,
        template=sandbox.template,
        cpus=sandbox.cpus,
        memory_mib=sandbox.memory_mib,
        state=sandbox.state.value,
        created_at=sandbox.created_at,
        workspace_id=sandbox.workspace_id,
        boot_mode=sandbox.boot_mode,
        boot_ms=sandbox.boot_ms,
        metadata=dict(sandbox.metadata),
        env=dict(sandbox.env),
        persistent=sandbox.persistent,
        ttl_s=sandbox.ttl_s,
        from_snapshot=sandbox.from_snapshot,
        instance_id=sandbox.instance_id,
        egress=_stored(sandbox.egress),
        vm=vm,
        hibernation=str(sandbox.hibernation.path) if sandbox.hibernation is not None else None,
        mapped_image=sandbox.mapped_image,
        volumes=[v.to_json() for v in sandbox.volumes],
    )


def adopted_sandbox(
    record: SandboxRecord,
    vm: MicroVM,
    now: float,
    *,
    state: SandboxState,
    slot: Slot | None = None,
    hibernation: SnapshotImage | None = None,
) -> Sandbox:
    """The sandbox an earlier agent left (``record``), on ``vm`` (its adopted QEMU, or a placeholder for a
    hibernated one, which wakes from ``hibernation``). A restart grants a fresh idle period (``now``)."""
    volumes = tuple(AttachedVolume.from_json(v) for v in record.volumes)
    vm.volumes = volumes if vm.state.alive else ()
    return Sandbox(
        id=record.id,
        template=record.template,
        cpus=record.cpus,
        memory_mib=record.memory_mib,
        vm=vm,
        created_at=record.created_at,
        boot_mode=record.boot_mode,
        boot_ms=record.boot_ms,
        state=state,
        workspace_id=record.workspace_id,
        metadata=dict(record.metadata),
        env=dict(record.env),
        persistent=record.persistent,
        ttl_s=record.ttl_s,
        last_active=now,
        from_snapshot=record.from_snapshot,
        instance_id=record.instance_id,
        egress=_policy(record.egress),
        slot=slot,
        hibernation=hibernation,
        mapped_image=record.mapped_image if hibernation is None else None,
        volumes=volumes,
        adopted=True,
    )


def fork_child(
    parent: Sandbox,
    child_id: str,
    vm: MicroVM,
    now: float,
    *,
    metadata: dict[str, str],
    instance_id: str,
    slot: Slot | None,
) -> Sandbox:
    """A fork child of ``parent`` on ``vm`` (cold-booted from a copy of the parent's disk): the parent's
    template, size, workspace, env and egress; its own id, metadata and instance id; no TTL, not persistent."""
    return Sandbox(
        id=child_id,
        template=parent.template,
        cpus=parent.cpus,
        memory_mib=parent.memory_mib,
        vm=vm,
        created_at=now,
        boot_mode="cold",
        workspace_id=parent.workspace_id,
        metadata=dict(metadata),
        env=dict(parent.env),
        last_active=now,
        instance_id=instance_id,
        slot=slot,
        egress=parent.egress,
    )


def stored_wake(
    spec: am.WakeSpec, image: SnapshotImage, vm: MicroVM, now: float, volumes: tuple[AttachedVolume, ...] = ()
) -> Sandbox:
    """A sandbox hibernated on another host, taken in here as hibernated: the identity and settings the control
    plane gives (``spec``), the size its imported ``image`` was captured with, ``vm`` a placeholder (no QEMU
    until it wakes), its ``volumes`` (this host's copies, in the slots the image has them in)."""
    return Sandbox(
        id=spec.sandbox_id,
        template=spec.template,
        cpus=image.machine.cpus,
        memory_mib=image.machine.memory_mib,
        vm=vm,
        created_at=spec.created_at,
        boot_mode=spec.boot_mode,
        state=SandboxState.HIBERNATED,
        workspace_id=spec.workspace_id,
        metadata=dict(spec.metadata),
        env=dict(spec.env),
        persistent=spec.persistent,
        ttl_s=spec.ttl_s,
        last_active=now,
        from_snapshot=spec.from_snapshot,
        instance_id=spec.instance_id,
        egress=spec.egress,
        hibernation=image,
        volumes=volumes,
    )


def sandbox_info(sandbox: Sandbox, now: float) -> am.SandboxInfo:
    """What the agent reports of ``sandbox`` at ``now`` (its idle time and expiry are computed for that time)."""
    return am.SandboxInfo(
        id=sandbox.id,
        template=sandbox.template,
        cpus=sandbox.cpus,
        memory_mib=sandbox.memory_mib,
        state=sandbox.state.value,
        workspace_id=sandbox.workspace_id,
        created_at=sandbox.created_at,
        metadata=dict(sandbox.metadata),
        env=dict(sandbox.env),
        boot_mode="cold" if sandbox.boot_mode == "cold" else "restore",
        boot_ms=sandbox.boot_ms,
        from_snapshot=sandbox.from_snapshot,
        instance_id=sandbox.instance_id or None,
        guest_ip=sandbox.guest_ip,
        vm_id=sandbox.vm.vm_id,
        ttl_s=sandbox.ttl_s,
        persistent=sandbox.persistent,
        last_active=sandbox.last_active,
        in_flight=sandbox.in_flight,
        expires_at=sandbox.expires_at,
        idle_s=round(sandbox.idle_s(now), 3),
        expired=sandbox.expired(now),
        egress=sandbox.egress,
        adopted=sandbox.adopted,
    )
