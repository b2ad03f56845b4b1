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
            # reservations first, rows second: a create's commit writes its row and deletes its reservation in one
            # transaction, and PostgreSQL (READ COMMITTED) gives each statement a snapshot of its own. Read the
            # other way round, a commit between the two statements hid both, and a sandbox created that moment was
            # deleted as a stray (its first exec answered 404: `bench fleet`, once). This way a statement that no
            # longer sees the reservation runs before one that sees the row.
            known.update(
                sid
                for sid in s.scalars(
                    select(m.Reservation.sandbox_id).where(
                        m.Reservation.sandbox_id.in_(chunk), m.Reservation.expires_at > now
                    )
                )
                if sid is not None and sid not in old
            )
            known.update(s.scalars(select(m.Sandbox.id).where(m.Sandbox.id.in_(chunk))))
    return [i for i in ids if i not in known]
