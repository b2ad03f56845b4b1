"""A create whose volumes' host is up but full: the volumes move to a host with room, if nothing else holds them.

A create with mounts is placed where its volumes are (:meth:`.volumes.VolumeControl.claim`). When that host has
no room (the placement's 503), :func:`place_moving_volumes` lets go of the create's attachments, reserves another
host (the full one avoided), moves each volume there through the object store (:meth:`.volumemoves.VolumeMover.
move`: the lease, a store of the changed chunks, the fetch), claims them again and restores the sandbox there. A
volume another sandbox holds cannot move: the create then gets the original 503 (with its ``Retry-After``) and
nothing changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ...agentapi import models as am
from ...errors import CryoboxError, HostUnavailable, StateError
from ...registry import SandboxRow
from .placement import PlacementRequest
from .timeouts import OnTimeout
from .volumes import MountRequest

if TYPE_CHECKING:
    from .sandboxes import ControlPlane

log = logging.getLogger(__name__)


async def place_moving_volumes(
    control: ControlPlane,
    placement: PlacementRequest,
    spec: am.CreateSpec,
    mounts: Sequence[MountRequest],
    full: HostUnavailable,
    on_timeout: OnTimeout | None = None,
) -> SandboxRow:
    """Restore ``spec`` on another host than ``placement.only`` (its volumes' full host), its volumes moved there
    first; ``full`` (the placement's refusal) is raised when no other host has room or a volume cannot move."""
    full_host = placement.only
    assert full_host is not None
    await control.volumes.sandbox_gone(spec.sandbox_id)  # the attachments the create made there
    elsewhere = replace(placement, only=None, prefer=None, avoid=placement.avoid | {full_host})
    try:
        reservation = await control.placement.reserve(elsewhere, spec.sandbox_id)
    except HostUnavailable:
        raise full from None
    target = reservation.agent
    try:
        for mount in mounts:
            row = await asyncio.to_thread(control.volumes.records.get, spec.workspace_id, mount.name)
            if row.host != target:
                try:
                    await control.volumes.mover.move(row, target)
                except StateError as err:  # held by another sandbox, or moving: it stays, and so does the 503
                    log.info("volume %s stays on full host %s: %s", row.id, full_host, err.message)
                    raise full from err
        attached, host = await control.volumes.claim(spec.workspace_id, spec.sandbox_id, mounts)
        if host != target:
            raise full
        agent = await control.fleet.agent(target)
        info = await agent.create(spec.model_copy(update={"volumes": attached}))
    except BaseException:
        with contextlib.suppress(CryoboxError):
            await control.placement.release(reservation)
        await control.volumes.sandbox_gone(spec.sandbox_id)
        raise
    log.info("create %s: its volumes moved from full host %s to %s", spec.sandbox_id, full_host, target)
    return await control.commit(info, target, agent, reservation, on_timeout)
