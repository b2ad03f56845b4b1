"""Portable hibernation in the registry: recording a stored hibernation and moving its sandbox to another host.

A drained sandbox is hibernated on its host and its image copied to the object store; its row then says
``hibernation: stored`` (with the template generation the image sits on and the sha256 of the manifest uploaded,
which the agent that wakes it checks). Such a row is *portable*: when its
host is draining, down or lacks it, the next request wakes it on another agent, and :meth:`MoveRecords.move`
swaps the row's host and settles that agent's reservation in one transaction, but only if the row still names
the old host and the stored image (a compare-and-swap: of two requests racing to wake one sandbox, one wins).

Every method is synchronous and runs one short transaction, like :class:`~.repo.Registry`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import and_, case, delete, select, update

from ..netpolicy import EgressPolicy
from ..util.sealing import Sealer
from . import envseal
from . import models as m
from .db import Database
from .rows import HIBERNATED, HIBERNATION_LOCAL, HIBERNATION_STORED, SandboxRow, _attr, _check_fields


class MoveRecords:
    """``sealer`` seals and opens the env of the rows it writes and returns (``Registry.sealer``)."""

    def __init__(self, db: Database, sealer: Sealer) -> None:
        self._db = db
        self._sealer = sealer

    def _values(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        checked = envseal.seal_changes(_check_fields(SandboxRow, changes), self._sealer)
        return {_attr(name): value for name, value in checked.items()}

    def hibernated(self, sandbox_id: str, host: str, egress: EgressPolicy | None, now: float | None = None) -> bool:
        """The row of ``sandbox_id`` on ``host`` is hibernated there (image local), with the network policy its
        agent hibernated it with (what a wake elsewhere applies), stamped ``hibernated_at`` ``now`` unless it was
        hibernated already; ``False`` when no such row."""
        changes = {"status": HIBERNATED, "hibernation": HIBERNATION_LOCAL, "egress": egress}
        values = self._values({**changes, "hibernation_manifest_sha256": None})  # a stored one is not this image
        kept = and_(m.Sandbox.status == HIBERNATED, m.Sandbox.hibernated_at.is_not(None))  # its retention runs on
        values["hibernated_at"] = case((kept, m.Sandbox.hibernated_at), else_=time.time() if now is None else now)
        with self._db.session(what=f"sandbox {sandbox_id}") as s:
            done = s.execute(update(m.Sandbox).where(m.Sandbox.id == sandbox_id, m.Sandbox.host == host).values(values))
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def stored(self, sandbox_id: str, host: str, generation: str | None, manifest_sha256: str | None = None) -> bool:
        """Its image is in the object store now (``hibernation: stored``, its manifest's sha256 pinned; ``None``
        from an agent that predates pinning); ``False`` unless the row still names ``host`` and says
        ``hibernated``."""
        values = self._values(
            {
                "hibernation": HIBERNATION_STORED,
                "hibernation_generation": generation,
                "hibernation_manifest_sha256": manifest_sha256,
            }
        )
        with self._db.session(what=f"sandbox {sandbox_id}") as s:
            done = s.execute(
                update(m.Sandbox)
                .where(m.Sandbox.id == sandbox_id, m.Sandbox.host == host, m.Sandbox.status == HIBERNATED)
                .values(values)
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def move(
        self, reservation_id: str, sandbox_id: str, *, from_host: str, to_host: str, changes: Mapping[str, Any]
    ) -> SandboxRow | None:
        """Point the row at ``to_host`` (with ``changes``, its hibernation cleared) and delete the reservation, in
        one transaction; only if the row still names ``from_host`` and its stored image. ``None`` (nothing changed,
        the reservation kept for the caller to release) otherwise."""
        cleared = {
            "hibernation": None,
            "hibernation_generation": None,
            "hibernation_manifest_sha256": None,
        }
        if changes.get("status") != HIBERNATED:
            cleared["hibernated_at"] = None
        values = self._values({**changes, "host": to_host, **cleared})
        with self._db.session(what=f"sandbox {sandbox_id}") as s:
            done = s.execute(
                update(m.Sandbox)
                .where(
                    m.Sandbox.id == sandbox_id,
                    m.Sandbox.host == from_host,
                    m.Sandbox.status == HIBERNATED,
                    m.Sandbox.hibernation == HIBERNATION_STORED,
                )
                .values(values)
            )
            if not done.rowcount:  # type: ignore[attr-defined]
                return None
            s.execute(delete(m.Reservation).where(m.Reservation.id == reservation_id))
            obj = s.get(m.Sandbox, sandbox_id)
            assert obj is not None
            return envseal.from_orm(obj, self._sealer)

    def elsewhere(self, host: str, sandbox_ids: Collection[str]) -> list[str]:
        """Of the sandboxes ``host`` reports, those whose row names another host and that no reservation of
        ``host`` is bringing there: copies left behind by a move (the agent should forget them)."""
        if not sandbox_ids:
            return []
        ids = sorted(sandbox_ids)
        with self._db.session(write=False) as s:
            moved = set(s.scalars(select(m.Sandbox.id).where(m.Sandbox.id.in_(ids), m.Sandbox.host != host)))
            coming = set(
                s.scalars(
                    select(m.Reservation.sandbox_id).where(
                        m.Reservation.agent == host, m.Reservation.sandbox_id.in_(ids)
                    )
                )
            )
        return sorted(moved - coming)
