"""Portable hibernation on the agent: copy a hibernated sandbox's image to the object store, and wake on this
host a sandbox that was hibernated on another one.

``store`` uploads the image of a hibernated sandbox (``hibernations/<id>/…``, the snapshot format: memory in
chunks, manifest last) while holding the sandbox's lock, so it cannot wake (or go) half-way; it is idempotent.
``wake_stored`` imports the stored image into this host's hibernation store (its overlay rebased onto this
host's copy of the template's disk, the memory downloaded and verified), then hands the sandbox to the service
(``SandboxService.wake_here``), which records it as hibernated here, with the identity the control plane gives
(id, workspace, metadata, env, instance id, TTL, egress: :func:`..sandbox.mapping.stored_wake`), and wakes it
like any local hibernation; the stored manifest must hash to the one the control plane pins
(``WakeSpec.manifest_sha256``, returned by ``store`` when it uploaded it). The download holds an admission slot;
the wake's restore takes its own (the service's restore gate), never one inside the other. The control plane
deletes the stored objects once the row names this host.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...agentapi import models as am
from ...errors import NotFound, ObjectNotFound, StateError
from ..host.startup import Host
from ..publish.hibernations import (
    VOLUMES_FIELD,
    import_hibernation,
    portable_volumes,
    publish_hibernation,
    stored_volumes,
)
from ..sandbox.admission import AdmissionController
from ..sandbox.mapping import stored_wake
from ..sandbox.sandbox import Sandbox, SandboxState
from ..vm.volumes import AttachedVolume

log = logging.getLogger(__name__)


class HibernationOps:
    def __init__(self, host: Host, admission: AdmissionController, info: Callable[[Sandbox], am.SandboxInfo]) -> None:
        self.host = host
        self.admission = admission
        self.info = info
        self._waking: dict[str, asyncio.Lock] = {}

    async def store(self, sandbox_id: str) -> am.StoredHibernation:
        """Upload the sandbox's hibernation image (``StateError`` unless it is hibernated); idempotent."""
        service = self.host.service
        sandbox = service.get(sandbox_id)
        template = service.template(sandbox.template)
        async with sandbox.lock:  # no wake, hibernation or delete while the image is read
            image = sandbox.hibernation
            if service.sandboxes.get(sandbox_id) is not sandbox:
                raise NotFound(f"sandbox {sandbox_id!r} not found", details={"id": sandbox_id})
            if sandbox.state is not SandboxState.HIBERNATED or image is None:
                raise StateError(
                    f"sandbox {sandbox_id} is {sandbox.state.value}: only a hibernation can be stored",
                    state=sandbox.state.value,
                    required="hibernated",
                )
            started = time.monotonic()
            volumes = portable_volumes(sandbox.volumes)  # the control plane moves them before a wake elsewhere
            publish = functools.partial(publish_hibernation, volumes=volumes)
            published = await asyncio.to_thread(publish, self.host.store, sandbox_id, image, template)
        log.info("hibernation of %s stored as %s in %.1f s", sandbox_id, published.key, time.monotonic() - started)
        return am.StoredHibernation(
            id=sandbox_id,
            store=self.host.store.url,
            key=published.key,
            generation=template.generation,
            size_bytes=image.size_bytes,
            unique_bytes=image.unique_bytes,
            shared_bytes=image.shared_bytes,
            manifest_sha256=published.manifest_sha256,
        )

    async def wake_stored(self, spec: am.WakeSpec) -> am.SandboxInfo:
        lock = self._waking.setdefault(spec.sandbox_id, asyncio.Lock())
        try:
            async with lock:  # concurrent calls for one sandbox import it once
                sandbox = await self._wake_stored(spec)
        finally:
            if not lock.locked():
                self._waking.pop(spec.sandbox_id, None)
        return self.info(sandbox)

    async def _wake_stored(self, spec: am.WakeSpec) -> Sandbox:
        service = self.host.service
        existing = service.sandboxes.get(spec.sandbox_id)
        if existing is not None:  # a retried call: wake the one it made (or the one that never left)
            if existing.workspace_id != spec.workspace_id:
                raise StateError(f"sandbox {spec.sandbox_id} already exists", state="exists", required="absent")
            return await service.wake(spec.sandbox_id)
        template = service.template(spec.template)  # 404 before queueing
        started = time.monotonic()
        root = service.hibernation.root
        async with self.admission.slot():  # the download is part of this restore; the wake below takes its own
            try:
                image_id = await asyncio.to_thread(
                    import_hibernation, self.host.store, spec.sandbox_id, root, template, spec.manifest_sha256
                )
            except ObjectNotFound:
                raise NotFound(
                    f"no hibernation of sandbox {spec.sandbox_id} in the object store", details={"id": spec.sandbox_id}
                ) from None
        imported_s = time.monotonic() - started
        image = await asyncio.to_thread(service.hibernation.load, image_id)
        try:
            volumes = self._volumes_here(spec.sandbox_id, image.manifest)
        except StateError:
            await asyncio.to_thread(service.hibernation.delete, image_id)
            raise
        placeholder = service.factory.placeholder(spec.sandbox_id, image.machine)  # no QEMU until it wakes
        sandbox = stored_wake(spec, image, placeholder, service.clock(), volumes)
        await service.wake_here(sandbox, started=started)  # recorded as hibernated here, then woken
        log.info(
            "sandbox %s woke here from the object store in %.0f ms (import %.1f s)",
            sandbox.id,
            sandbox.boot_ms,
            imported_s,
        )
        return sandbox

    def _volumes_here(self, sandbox_id: str, manifest: dict[str, Any]) -> tuple[AttachedVolume, ...]:
        """The stored sandbox's volumes, each in its slot, at this host's copy (409 when one is not here: the
        control plane moves them first)."""
        if not manifest.get(VOLUMES_FIELD):
            return ()
        store = self.host.volumes
        volumes = stored_volumes(manifest, store.path) if store is not None else ()
        missing = [v.name for v in volumes if not Path(v.path).is_file()] if store is not None else ["(any)"]
        if missing:
            raise StateError(
                f"sandbox {sandbox_id} wakes with volume(s) {', '.join(missing)}, which this host does not hold",
                state="elsewhere",
                required="its volumes here",
                details={"id": sandbox_id, "volumes": missing},
            )
        return volumes


class HibernationEndpoints:
    """The interface's portable-hibernation methods, mixed into :class:`~.hostagent.HostAgent`."""

    host: Host
    admission: AdmissionController

    def _info(self, sandbox: Sandbox) -> am.SandboxInfo:
        raise NotImplementedError  # HostAgent's

    @functools.cached_property
    def hibernations(self) -> HibernationOps:
        return HibernationOps(self.host, self.admission, self._info)

    async def store_hibernation(self, sandbox_id: str) -> am.StoredHibernation:
        return await self.hibernations.store(sandbox_id)

    async def wake_stored(self, spec: am.WakeSpec) -> am.SandboxInfo:
        return await self.hibernations.wake_stored(spec)
