"""Volumes in the registry (``volumes``, ``volume_attachments``; revision 0014).

A volume is named per workspace and lives on one host at a time (``host``: the agent holding its image). Its
attachments are rows of ``volume_attachments``: **one writer or any number of readers** (a reader of a file
system another guest writes would read stale or torn metadata). The read-write attachment is also ``writer`` on
the volume row, taken by a conditional update (``writer IS NULL`` and no attachment at all) in the same
transaction as its attachment row, so two writers, or a writer and a reader, can never be recorded whichever
replica asks. A volume with any attachment is not deleted. Every method is
synchronous and runs one short transaction, like :class:`~.repo.Registry`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from ..errors import NotFound, StateError
from . import models as m
from .db import Database

VOLUME_STATUSES = ("ready", "lost")


@dataclass(frozen=True)
class VolumeAttachment:
    volume_id: str
    sandbox_id: str
    path: str
    read_only: bool
    created_at: float


@dataclass(frozen=True)
class VolumeRow:
    id: str
    workspace_id: str
    name: str
    size_bytes: int
    host: str
    created_at: float
    filesystem: str = "ext4"
    status: str = "ready"
    writer: str | None = None
    """The sandbox holding its read-write attachment, if any."""
    attachments: tuple[VolumeAttachment, ...] = ()
    stored_sha256: str | None = None
    """The manifest sha256 of its last copy in the object store (``None``: never stored)."""
    stored_at: float | None = None
    move_target: str | None = None
    """Where a move in progress takes it (its lease is held)."""
    move_started_at: float | None = None


def _attachment(row: m.VolumeAttachment) -> VolumeAttachment:
    return VolumeAttachment(row.volume_id, row.sandbox_id, row.path, row.read_only, row.created_at)


class VolumeRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    @staticmethod
    def _row(s: Session, obj: m.Volume) -> VolumeRow:
        attached = s.scalars(
            select(m.VolumeAttachment)
            .where(m.VolumeAttachment.volume_id == obj.id)
            .order_by(m.VolumeAttachment.created_at, m.VolumeAttachment.sandbox_id)
        )
        return VolumeRow(
            id=obj.id,
            workspace_id=obj.workspace_id,
            name=obj.name,
            size_bytes=obj.size_bytes,
            host=obj.host,
            created_at=obj.created_at,
            filesystem=obj.filesystem,
            status=obj.status,
            writer=obj.writer,
            attachments=tuple(_attachment(a) for a in attached),
            stored_sha256=obj.stored_sha256,
            stored_at=obj.stored_at,
            move_target=obj.move_target,
            move_started_at=obj.move_started_at,
        )

    def add(self, row: VolumeRow) -> VolumeRow:
        """Insert a volume; :class:`~.db.AlreadyExists` when its workspace has one of that name."""
        with self._db.session(what=f"volume {row.name}") as s:
            obj = m.Volume(
                id=row.id,
                workspace_id=row.workspace_id,
                name=row.name,
                size_bytes=row.size_bytes,
                host=row.host,
                created_at=row.created_at,
                filesystem=row.filesystem,
                status=row.status,
                writer=None,
            )
            s.add(obj)
            s.flush()
            return self._row(s, obj)

    def get(self, workspace_id: str, name: str) -> VolumeRow:
        """The workspace's volume ``name`` (404 otherwise, also across workspaces)."""
        with self._db.session(write=False) as s:
            obj = s.scalar(select(m.Volume).where(m.Volume.workspace_id == workspace_id, m.Volume.name == name))
            if obj is None:
                raise NotFound(f"volume {name!r} not found", details={"volume": name})
            return self._row(s, obj)

    def by_id(self, volume_id: str) -> VolumeRow:
        with self._db.session(write=False) as s:
            obj = s.get(m.Volume, volume_id)
            if obj is None:
                raise NotFound(f"volume {volume_id} not found", details={"volume_id": volume_id})
            return self._row(s, obj)

    def list_volumes(self, workspace_id: str | None = None, host: str | None = None) -> list[VolumeRow]:
        query = select(m.Volume).order_by(m.Volume.created_at, m.Volume.id)
        if workspace_id is not None:
            query = query.where(m.Volume.workspace_id == workspace_id)
        if host is not None:
            query = query.where(m.Volume.host == host)
        with self._db.session(write=False) as s:
            return [self._row(s, obj) for obj in s.scalars(query)]

    def usage(self, workspace_id: str) -> tuple[int, int]:
        """(count, total size in bytes) of the workspace's volumes."""
        with self._db.session(write=False) as s:
            count, total = s.execute(
                select(func.count(m.Volume.id), func.coalesce(func.sum(m.Volume.size_bytes), 0)).where(
                    m.Volume.workspace_id == workspace_id
                )
            ).one()
        return int(count), int(total)

    def resize(self, volume_id: str, size_bytes: int) -> VolumeRow:
        with self._db.session(what=f"volume {volume_id}") as s:
            obj = s.get(m.Volume, volume_id)
            if obj is None:
                raise NotFound(f"volume {volume_id} not found", details={"volume_id": volume_id})
            obj.size_bytes = size_bytes
            s.flush()
            return self._row(s, obj)

    def delete(self, volume_id: str) -> None:
        """Remove a volume with no attachment (409 ``wrong_state`` while it has one; idempotent otherwise)."""
        with self._db.session(what=f"volume {volume_id}") as s:
            attached = s.scalars(select(m.VolumeAttachment.sandbox_id).where(m.VolumeAttachment.volume_id == volume_id))
            holders = sorted(attached)
            if holders:
                raise StateError(
                    f"volume {volume_id} is attached to {', '.join(holders)}: detach it (delete those sandboxes)",
                    state="attached",
                    required="detached",
                    details={"attached_to": holders},
                )
            s.execute(delete(m.Volume).where(m.Volume.id == volume_id))

    def attach(self, volume_id: str, sandbox_id: str, path: str, *, read_only: bool) -> VolumeAttachment:
        """Record ``sandbox_id``'s attachment: a read-write one when the volume has no other attachment, a
        read-only one when it has no writer; 409 otherwise (nothing is written)."""
        with self._db.session(what=f"volume {volume_id}") as s:
            vol = s.scalar(select(m.Volume).where(m.Volume.id == volume_id).with_for_update())
            if vol is None:
                raise NotFound(f"volume {volume_id} not found", details={"volume_id": volume_id})
            return self._attach(s, vol, sandbox_id, path, read_only)

    def attach_named(
        self, workspace_id: str, name: str, sandbox_id: str, path: str, *, read_only: bool, alive_after: float
    ) -> VolumeRow | None:
        """:meth:`attach` by the volume's name where it is, in one transaction that first reads its host: only
        when that agent is ``up`` with a heartbeat at or after ``alive_after`` (a create's common case, in one round
        trip); ``None`` otherwise, and nothing is written (an attachment made only to be undone could stop another
        replica's move of the volume). 404 for an unknown name; 409 as :meth:`attach`."""
        with self._db.session(what=f"volume {name}") as s:
            vol = s.scalar(
                select(m.Volume).where(m.Volume.workspace_id == workspace_id, m.Volume.name == name).with_for_update()
            )
            if vol is None:
                raise NotFound(f"volume {name!r} not found", details={"volume": name})
            host = s.get(m.Agent, vol.host)
            if host is None or host.status != "up" or host.heartbeat_at < alive_after:
                return None
            self._attach(s, vol, sandbox_id, path, read_only)
            s.refresh(vol)
            return self._row(s, vol)

    def _attach(self, s: Session, vol: m.Volume, sandbox_id: str, path: str, read_only: bool) -> VolumeAttachment:
        volume_id = vol.id
        now = time.time()
        if vol.move_token is not None:
            raise _moving(volume_id, vol.move_target)
        others = (
            select(m.VolumeAttachment.sandbox_id)
            .where(m.VolumeAttachment.volume_id == volume_id, m.VolumeAttachment.sandbox_id != sandbox_id)
            .exists()
        )
        if read_only:
            writer = s.scalar(select(m.Volume.writer).where(m.Volume.id == volume_id))
            if writer is not None and writer != sandbox_id:
                raise StateError(
                    f"volume {volume_id} is attached read-write to {writer}",
                    state="attached",
                    required="detached",
                    details={"writer": writer},
                )
        else:
            taken = s.execute(
                update(m.Volume)
                .where(m.Volume.id == volume_id, m.Volume.writer.is_(None), ~others)
                .values(writer=sandbox_id)
            )
            if not taken.rowcount:  # type: ignore[attr-defined]
                writer = s.scalar(select(m.Volume.writer).where(m.Volume.id == volume_id))
                if writer != sandbox_id:
                    readers = sorted(
                        s.scalars(
                            select(m.VolumeAttachment.sandbox_id).where(m.VolumeAttachment.volume_id == volume_id)
                        )
                    )
                    raise StateError(
                        f"volume {volume_id} is attached to {writer or ', '.join(readers)}",
                        state="attached",
                        required="detached",
                        details={"writer": writer, "readers": [] if writer else readers},
                    )
        row = m.VolumeAttachment(
            volume_id=volume_id, sandbox_id=sandbox_id, path=path, read_only=read_only, created_at=now
        )
        s.merge(row)
        s.flush()
        return VolumeAttachment(volume_id, sandbox_id, path, read_only, now)

    def detach_sandbox(self, sandbox_id: str) -> list[str]:
        """Drop every attachment of ``sandbox_id`` (and the writer slots it held); the volume ids (idempotent)."""
        with self._db.session(what=f"sandbox {sandbox_id}'s volumes") as s:
            ids = sorted(
                s.scalars(select(m.VolumeAttachment.volume_id).where(m.VolumeAttachment.sandbox_id == sandbox_id))
            )
            s.execute(delete(m.VolumeAttachment).where(m.VolumeAttachment.sandbox_id == sandbox_id))
            s.execute(update(m.Volume).where(m.Volume.writer == sandbox_id).values(writer=None))
            return ids

    def mounts_of(self, sandbox_id: str) -> list[tuple[VolumeAttachment, str]]:
        """The sandbox's attachments with their volumes' names, in one read."""
        with self._db.session(write=False) as s:
            rows = s.execute(
                select(m.VolumeAttachment, m.Volume.name)
                .join(m.Volume, m.Volume.id == m.VolumeAttachment.volume_id)
                .where(m.VolumeAttachment.sandbox_id == sandbox_id)
                .order_by(m.VolumeAttachment.created_at, m.VolumeAttachment.volume_id)
            ).all()
            return [(_attachment(a), name) for a, name in rows]

    def attachments_of(self, sandbox_id: str) -> list[VolumeAttachment]:
        with self._db.session(write=False) as s:
            return [
                _attachment(a)
                for a in s.scalars(
                    select(m.VolumeAttachment)
                    .where(m.VolumeAttachment.sandbox_id == sandbox_id)
                    .order_by(m.VolumeAttachment.created_at, m.VolumeAttachment.volume_id)
                )
            ]

    # -- moves (revision 0016) ------------------------------------------------------------------------------------

    def begin_move(
        self,
        volume_id: str,
        source: str,
        target: str,
        now: float,
        stale_s: float,
        *,
        attached_ok: bool = False,
        holders: Collection[str] = (),
    ) -> str:
        """Take the move lease of a volume that is on ``source``, has no attachment (unless ``attached_ok``: a
        restore from a lost host; or only ``holders``' attachments: hibernated sandboxes it follows to their new
        host) and no fresh lease (one older than ``stale_s`` is taken over); returns its token. 409 otherwise,
        nothing written. The row is locked first, so an attachment recorded concurrently is seen."""
        token = secrets.token_hex(16)
        with self._db.session(what=f"volume {volume_id}") as s:
            vol = s.scalar(select(m.Volume).where(m.Volume.id == volume_id).with_for_update())
            if vol is None:
                raise NotFound(f"volume {volume_id} not found", details={"volume_id": volume_id})
            if vol.host != source:
                raise StateError(
                    f"volume {volume_id} is on {vol.host} now, not {source}",
                    state="moved",
                    required=f"on {source}",
                    details={"host": vol.host},
                )
            if vol.move_token is not None and (vol.move_started_at or 0.0) > now - stale_s:
                raise _moving(volume_id, vol.move_target)
            holders_now = sorted(
                s.scalars(select(m.VolumeAttachment.sandbox_id).where(m.VolumeAttachment.volume_id == volume_id))
            )
            if holders_now and not attached_ok and not set(holders_now) <= set(holders):
                raise StateError(
                    f"volume {volume_id} is attached to {', '.join(holders_now)} on {source}: it cannot move",
                    state="attached",
                    required="detached",
                    details={"attached_to": holders_now},
                )
            held = m.Volume.move_token.is_(None) if vol.move_token is None else m.Volume.move_token == vol.move_token
            taken = s.execute(
                update(m.Volume)
                .where(m.Volume.id == volume_id, m.Volume.host == source, held)
                .values(move_token=token, move_target=target, move_started_at=now)
            )
            if not taken.rowcount:  # type: ignore[attr-defined]
                raise _moving(volume_id, target)
        return token

    def record_stored(self, volume_id: str, token: str | None, sha256: str, at: float) -> VolumeRow:
        """Record the volume's copy in the object store (with ``token``: only while that move lease is held)."""
        with self._db.session(what=f"volume {volume_id}") as s:
            cond = [m.Volume.id == volume_id]
            if token is not None:
                cond.append(m.Volume.move_token == token)
            done = s.execute(update(m.Volume).where(*cond).values(stored_sha256=sha256, stored_at=at))
            if not done.rowcount:  # type: ignore[attr-defined]
                raise _moving(volume_id, None)
            obj = s.get(m.Volume, volume_id)
            assert obj is not None
            s.refresh(obj)
            return self._row(s, obj)

    def finish_move(self, volume_id: str, token: str, target: str, *, detach: bool = False) -> VolumeRow:
        """The target holds the volume now: ``host`` becomes ``target`` and the lease is released, in one
        conditional update (only the lease's holder can). ``detach``: drop its attachments too (a restore: they
        were the lost host's sandboxes). 409 when the lease was taken over; nothing is written then."""
        with self._db.session(what=f"volume {volume_id}") as s:
            done = s.execute(
                update(m.Volume)
                .where(m.Volume.id == volume_id, m.Volume.move_token == token)
                .values(host=target, move_token=None, move_target=None, move_started_at=None, status="ready")
            )
            if not done.rowcount:  # type: ignore[attr-defined]
                raise _moving(volume_id, None)
            if detach:
                s.execute(delete(m.VolumeAttachment).where(m.VolumeAttachment.volume_id == volume_id))
                s.execute(update(m.Volume).where(m.Volume.id == volume_id).values(writer=None))
            obj = s.get(m.Volume, volume_id)
            assert obj is not None
            s.refresh(obj)
            return self._row(s, obj)

    def abort_move(self, volume_id: str, token: str) -> None:
        """Release the lease without moving (idempotent; a lease taken over is left to its new holder)."""
        with self._db.session(what=f"volume {volume_id}") as s:
            s.execute(
                update(m.Volume)
                .where(m.Volume.id == volume_id, m.Volume.move_token == token)
                .values(move_token=None, move_target=None, move_started_at=None)
            )


def _moving(volume_id: str, target: str | None) -> StateError:
    return StateError(
        f"volume {volume_id} is moving between hosts{f' (to {target})' if target else ''}: try again shortly",
        state="moving",
        required="settled",
        details={"volume_id": volume_id, "target": target},
    )
