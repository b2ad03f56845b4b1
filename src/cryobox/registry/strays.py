"""Which sandboxes an agent reports that the registry does not know: no row, and no unexpired reservation that
names them (a create, fork, tree child or wake still settling holds one until its row is written, in the same
transaction that deletes the reservation). Such a sandbox was made for a control plane that died before it
wrote the row, or was recorded by an agent killed before it answered: nobody can reach it."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select

from . import models as m
from .db import Database

CHUNK = 500


def unknown_sandboxes(db: Database, reported: Collection[str], now: float, adopted: Collection[str] = ()) -> list[str]:
    """The ids of ``reported`` with neither a sandbox row nor an unexpired reservation. For ``adopted`` ones
    (taken over by a restarted agent) only a row counts: the agent process that made them is dead, so no call
    to it is still settling; a reservation naming one belongs to a request that failed (or to a control plane
    that died with the agent, under ``cryobox serve``)."""
    ids = sorted(set(reported))
    old = set(adopted)
    known: set[str] = set()
    with db.session(write=False) as s:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            known.update(s.scalars(select(m.Sandbox.id).where(m.Sandbox.id.in_(chunk))))
            known.update(
                sid
                for sid in s.scalars(
                    select(m.Reservation.sandbox_id).where(
                        m.Reservation.sandbox_id.in_(chunk), m.Reservation.expires_at > now
                    )
                )
                if sid is not None and sid not in old
            )
    return [i for i in ids if i not in known]
