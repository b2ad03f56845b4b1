"""Web console sessions in the registry (``console_sessions``, revision 0009).

A row is keyed by the SHA-256 of the session cookie's random token, so a copy of the table holds no live
cookie. A session is valid while it is not ended (logout), not expired, and the API key that opened it is not
revoked: one query answers all three, on every replica. Every method is synchronous and runs one short
transaction, like :class:`~.repo.Registry`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import delete, or_, select, update

from . import keys
from . import models as m
from .db import Database
from .rows import WorkspaceInfo, _workspace_info


@dataclass(frozen=True)
class SessionInfo:
    workspace: WorkspaceInfo
    key_id: str
    expires_at: float


class SessionRecords:
    def __init__(self, database: Database) -> None:
        self._db = database

    def open(self, plaintext_key: str, session_hash: str, expires_at: float) -> SessionInfo | None:
        """A new session for a valid, unrevoked key; ``None`` (and nothing stored) for any other key."""
        if not plaintext_key:
            return None
        with self._db.session(what="console session") as s:
            candidates = s.execute(
                select(m.ApiKey.id, m.ApiKey.hash, m.Workspace)
                .join(m.Workspace, m.Workspace.id == m.ApiKey.workspace_id)
                .where(m.ApiKey.prefix == keys.key_prefix(plaintext_key), m.ApiKey.revoked_at.is_(None))
            ).all()
            match: tuple[str, m.Workspace] | None = None
            for key_id, stored_hash, workspace in candidates:  # check all candidates: no early exit
                if keys.verify_key(plaintext_key, stored_hash):
                    match = (key_id, workspace)
            if match is None:
                return None
            key_id, workspace = match
            s.add(
                m.ConsoleSession(
                    id=session_hash,
                    key_id=key_id,
                    workspace_id=workspace.id,
                    created_at=time.time(),
                    expires_at=expires_at,
                    ended_at=None,
                )
            )
            return SessionInfo(_workspace_info(workspace), key_id, expires_at)

    def lookup(self, session_hash: str, now: float) -> SessionInfo | None:
        """The live session of this hash: not ended, not expired at ``now``, its key not revoked."""
        with self._db.session(write=False) as s:
            row = s.execute(
                select(m.ConsoleSession.key_id, m.ConsoleSession.expires_at, m.Workspace)
                .join(m.ApiKey, m.ApiKey.id == m.ConsoleSession.key_id)
                .join(m.Workspace, m.Workspace.id == m.ConsoleSession.workspace_id)
                .where(
                    m.ConsoleSession.id == session_hash,
                    m.ConsoleSession.ended_at.is_(None),
                    m.ConsoleSession.expires_at > now,
                    m.ApiKey.revoked_at.is_(None),
                )
            ).first()
            if row is None:
                return None
            key_id, expires_at, workspace = row
            return SessionInfo(_workspace_info(workspace), key_id, expires_at)

    def extend(self, session_hash: str, expires_at: float) -> None:
        """Slide a live session's expiry forward (never backward)."""
        with self._db.session(what="console session") as s:
            s.execute(
                update(m.ConsoleSession)
                .where(
                    m.ConsoleSession.id == session_hash,
                    m.ConsoleSession.ended_at.is_(None),
                    m.ConsoleSession.expires_at < expires_at,
                )
                .values(expires_at=expires_at)
            )

    def end(self, session_hash: str, now: float) -> None:
        """Logout: the session stops working on every replica (idempotent)."""
        with self._db.session(what="console session") as s:
            s.execute(
                update(m.ConsoleSession)
                .where(m.ConsoleSession.id == session_hash, m.ConsoleSession.ended_at.is_(None))
                .values(ended_at=now)
            )

    def purge(self, before: float) -> int:
        """Forget sessions that expired or ended before ``before``; the number removed."""
        with self._db.session(what="console session") as s:
            result = s.execute(
                delete(m.ConsoleSession).where(
                    or_(m.ConsoleSession.expires_at < before, m.ConsoleSession.ended_at < before)
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)
