"""The control plane's sandbox operations: admission, the host agent, the registry and metrics together.

The host agent (:class:`SandboxService`) owns live VMs; the registry owns what must survive a restart. A
sandbox row is written only after its VM answered, and removed before the VM is killed on delete, so a crash
leaves at worst a row whose VM is gone (``reconcile`` marks it stopped at the next start), never a VM no row
knows about (startup reclaim kills those).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from ..agent.sandbox import Sandbox
from ..agent.service import SandboxService
from ..errors import CryoboxError, HostUnavailable, InvalidArgument, NotFound
from ..registry import Registry, SandboxRow
from .admission import AdmissionController
from .metrics import Metrics
from .placement import Placement
from .snapshots_ctl import SnapshotControl
from .templates_ctl import TemplateJobs, TemplatePreparer, row_for_template

log = logging.getLogger(__name__)
UNSET = object()  # "not given" in a PATCH, distinct from an explicit null


@dataclass(frozen=True)
class CreateRequest:
    template: str
    workspace_id: str
    metadata: dict[str, str]
    env: dict[str, str]
    ttl_s: int | None
    persistent: bool
    from_snapshot: str | None = None
    egress: list[str] | None = None


def row_for(sandbox: Sandbox, host: str) -> SandboxRow:
    return SandboxRow(
        id=sandbox.id,
        workspace_id=sandbox.workspace_id,
        template=sandbox.template,
        cpu=sandbox.cpus,
        memory_mb=sandbox.memory_mib,
        status=sandbox.state.value,
        metadata=sandbox.metadata,
        env=sandbox.env,
        boot_ms=sandbox.boot_ms,
        boot_mode=sandbox.boot_mode,
        host=host,
        created_at=sandbox.created_at,
        persistent=sandbox.persistent,
        ttl_seconds=sandbox.ttl_s,
        expires_at=sandbox.expires_at,
        last_active_at=sandbox.last_active,
        vm_id=sandbox.vm.vm_id,
        from_snapshot=sandbox.from_snapshot,
        guest_ip=sandbox.guest_ip,
        instance_id=sandbox.instance_id or None,
    )


class ControlPlane:
    def __init__(
        self,
        service: SandboxService,
        registry: Registry,
        admission: AdmissionController,
        metrics: Metrics,
        host: str,
        snapshots: SnapshotControl,
        preparer: TemplatePreparer | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.service = service
        self.placement = placement
        self.snapshots = snapshots
        self.registry = registry
        self.admission = admission
        self.metrics = metrics
        self.host = host
        self.templates = TemplateJobs(service, registry, preparer)
        metrics.set_sandbox_state_provider(self.state_counts)

    def state_counts(self) -> dict[str, int]:
        return dict(Counter(s.state.value for s in self.service.all()))

    async def startup(self) -> None:
        """Record templates; rows of sandboxes that did not survive the restart become ``stopped``."""
        for template in self.service.templates.values():
            await asyncio.to_thread(self.registry.upsert_template, row_for_template(template, None, None))
        report = await asyncio.to_thread(
            self.registry.reconcile, lambda path: Path(path).exists(), {s.id for s in self.service.all()}
        )
        if report.stopped_sandboxes:
            log.info("reconcile: %d sandbox rows marked stopped (VMs gone)", len(report.stopped_sandboxes))
        await self.snapshots.reconcile({s.id for s in self.service.all()})
        await self.templates.resume_builds()

    async def create(self, request: CreateRequest) -> SandboxRow:
        image = None
        if request.from_snapshot is not None:  # 404 before queueing
            image = await self.snapshots.image(request.from_snapshot, request.workspace_id)
        else:
            await self.templates.require_ready(request.template, request.workspace_id)  # 404/409 before queueing
        started = time.monotonic()
        # capacity is reserved now, when the decision is made, so a burst is counted in full before any of it
        # lands (and spreads across hosts when there are several)
        reservation = self.placement.reserve() if self.placement is not None else None
        try:
            async with self.admission.slot():
                sandbox = await self.service.create(
                    request.template,
                    from_snapshot=image,
                    metadata=request.metadata,
                    env=request.env,
                    ttl_s=request.ttl_s,
                    persistent=request.persistent,
                    workspace_id=request.workspace_id,
                    egress=request.egress,
                )
            if reservation is not None:
                reservation.commit()  # the sandbox now counts in the host's own numbers
        except HostUnavailable:
            self.metrics.observe_create("refused", "restore")
            raise
        except BaseException:
            self.metrics.observe_create("error", "restore")
            raise
        finally:
            if reservation is not None:
                reservation.release()  # no-op once committed
        row = await self.record(sandbox)
        self.metrics.observe_create("ok", sandbox.boot_mode, time.monotonic() - started)
        return row

    async def record(self, sandbox: Sandbox) -> SandboxRow:
        """Write the row of a sandbox whose VM answered; if that fails, the VM goes too."""
        row = row_for(sandbox, self.host)
        try:
            await asyncio.to_thread(self.registry.add_sandbox, row)
        except BaseException:
            await self.service.delete(sandbox.id)
            self.metrics.observe_create("error", sandbox.boot_mode)
            raise
        return row

    async def get(self, sandbox_id: str, workspace_id: str) -> SandboxRow:
        row = await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)
        return self._with_live_state(row)

    def _with_live_state(self, row: SandboxRow) -> SandboxRow:
        live = self.service.sandboxes.get(row.id)
        if live is None:
            return row
        return replace(
            row,
            status=live.state.value,
            expires_at=live.expires_at,
            last_active_at=live.last_active,
            ttl_seconds=live.ttl_s,
            persistent=live.persistent,
            guest_ip=live.guest_ip,
        )

    async def list_rows(self, workspace_id: str, status: str | None, metadata: dict[str, str]) -> list[SandboxRow]:
        rows = await asyncio.to_thread(self.registry.list_sandboxes, workspace_id, None, metadata)
        return [r for r in map(self._with_live_state, rows) if status is None or r.status == status]

    async def delete(self, sandbox_id: str, workspace_id: str, keep_snapshots: bool = False) -> None:
        """Row, then snapshots (deleted, or orphaned when ``retain``/``keep_snapshots``), then the VM."""
        await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id)  # 404 across workspaces
        await asyncio.to_thread(self.registry.delete_sandbox, sandbox_id)
        await self.snapshots.sandbox_gone(sandbox_id, keep_snapshots=keep_snapshots)
        with contextlib.suppress(NotFound):
            await self.service.delete(sandbox_id, workspace_id)

    async def set_status(self, sandbox: Sandbox) -> None:
        await asyncio.to_thread(
            functools.partial(
                self.registry.update_sandbox,
                sandbox.id,
                status=sandbox.state.value,
                vm_id=sandbox.vm.vm_id,
                guest_ip=sandbox.guest_ip,
            )
        )

    async def update_lifecycle(
        self, sandbox_id: str, workspace_id: str, *, ttl_s: int | None | object, persistent: bool | None
    ) -> SandboxRow:
        sandbox = self.service.get(sandbox_id, workspace_id)
        if ttl_s is not UNSET:
            if ttl_s is not None and not isinstance(ttl_s, int):
                raise InvalidArgument("ttl_seconds must be an integer or null")
            sandbox.ttl_s = ttl_s
        if persistent is not None:
            sandbox.persistent = persistent
        sandbox.touch(self.service.clock())
        await asyncio.to_thread(
            self.registry.update_sandbox,
            sandbox_id,
            ttl_seconds=sandbox.ttl_s,
            persistent=sandbox.persistent,
            expires_at=sandbox.expires_at,
            last_active_at=sandbox.last_active,
        )
        return self._with_live_state(await asyncio.to_thread(self.registry.get_sandbox, sandbox_id, workspace_id))

    async def reap_expired(self) -> list[str]:
        """Delete sandboxes idle past their TTL (rows first, then VMs)."""
        now = self.service.clock()
        expired = [s for s in self.service.all() if s.expires_at is not None and s.expires_at <= now]
        for sandbox in expired:
            try:
                await asyncio.to_thread(self.registry.delete_sandbox, sandbox.id)
                await self.snapshots.sandbox_gone(sandbox.id, keep_snapshots=False)
                await self.service.delete(sandbox.id)
                log.info(
                    "sandbox %s expired after %.0fs idle (ttl %ss)", sandbox.id, sandbox.idle_s(now), sandbox.ttl_s
                )
            except (CryoboxError, OSError) as err:
                log.warning("reaping %s failed: %s", sandbox.id, err)
        return [s.id for s in expired]
