"""The registry: workspaces, API keys, templates, sandboxes and snapshots, kept in SQLite or PostgreSQL.

The fleet's shared state (agents, reservations, per-host reconciliation) is :attr:`Registry.fleet`
(:mod:`cryobox.registry.fleet`).

Every method is synchronous, runs one short transaction and returns frozen dataclasses, never ORM objects, so
callers may use the results from any thread after the session is gone.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from ..errors import InvalidArgument, NotFound
from ..util.sealing import Sealer
from . import envseal, keys
from . import models as m
from .db import AlreadyExists, Database, url_for_data_dir
from .fleet import FleetRecords
from .rows import (
    HIBERNATED,
    STOPPED_STATUSES,
    ApiKeyInfo,
    ReconcileReport,
    SandboxRow,
    SnapshotRow,
    TemplateRow,
    WorkspaceInfo,
    _attr,
    _changes,
    _check_fields,
    _chunks,
    _from_orm,
    _key_info,
    _subset,
    _to_orm,
    _workspace_info,
)

# ---------------------------------------------------------------------------------------------------------------
# the registry


class Registry:
    """Synchronous, thread-safe access to the registry database. Call :meth:`migrate` once before use.

    Sandbox env is sealed at rest by ``sealer`` (default: :func:`~.envseal.registry_sealer` for ``url``).
    """

    def __init__(self, url: str, sealer: Sealer | None = None) -> None:
        self._db = Database(url)
        self._sealer = sealer if sealer is not None else envseal.registry_sealer(url)
        self._fleet = FleetRecords(self._db, self._sealer)

    @classmethod
    def for_data_dir(cls, data_dir: Path, env: Mapping[str, str] | None = None) -> Registry:
        """``CRYOBOX_DATABASE_URL`` from ``env`` (default: ``os.environ``) if set, else ``data_dir/registry.sqlite``;
        env sealed with ``CRYOBOX_SECRET_KEY`` from ``env`` if set, else ``data_dir/secrets/registry.key``.

        A bare ``postgresql://`` URL is rewritten to ``postgresql+psycopg://``.
        """
        url = url_for_data_dir(data_dir, env)
        return cls(url, envseal.registry_sealer(url, data_dir, env))

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._db.url

    @property
    def database(self) -> Database:
        return self._db

    @property
    def sealer(self) -> Sealer:
        """What seals sandbox env at rest (for :class:`~.moves.MoveRecords` and other row writers)."""
        return self._sealer

    @property
    def fleet(self) -> FleetRecords:
        """Agents, capacity reservations and per-host reconciliation (the fleet's shared state)."""
        return self._fleet

    def identity(self) -> str:
        """This registry's id (revision 0015): how it names itself in the object store (``owners/``)."""
        with self._db.session(write=False, what="registry identity") as s:
            row = s.get(m.RegistryMeta, "registry_id")
            if row is None:
                raise NotFound("the registry has no identity: migrate it first")
            return row.value

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision and seal any plaintext env left by older versions
        (idempotent)."""
        self._db.migrate()
        envseal.seal_plaintext(self._db, self._sealer)

    def migrated_already(self) -> bool:
        """Whether the schema is at the newest revision already; if so, also seal plaintext env (what
        :meth:`migrate` would do then). Writes no schema: an upgrade's successor calls it while its predecessor
        still serves, so that after the hand-over it has no migration left to wait for."""
        if self._db.current_revision() != self._db.head_revision():
            return False
        envseal.seal_plaintext(self._db, self._sealer)
        return True

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workspaces ------------------------------------------------------------------------------------------

    def ensure_workspace(self, name: str) -> WorkspaceInfo:
        """The workspace called ``name``, created if missing (safe against concurrent callers)."""
        if not name or not name.strip() or len(name) > 255:
            raise InvalidArgument("workspace name must be 1-255 characters and not blank", details={"name": name})
        for _ in range(2):
            with self._db.session(write=False) as s:
                found = s.scalar(select(m.Workspace).where(m.Workspace.name == name))
                if found is not None:
                    return _workspace_info(found)
            try:
                with self._db.session(what=f"workspace {name!r}") as s:
                    obj = m.Workspace(id=f"ws-{secrets.token_hex(8)}", name=name, created_at=time.time())
                    s.add(obj)
                    s.flush()
                    return _workspace_info(obj)
            except AlreadyExists:
                continue  # created by a concurrent caller in between: read it
        raise AssertionError("unreachable: workspace neither found nor created")  # pragma: no cover

    def get_workspace(self, workspace_id: str) -> WorkspaceInfo:
        with self._db.session(write=False) as s:
            return _workspace_info(self._workspace(s, workspace_id))

    def list_workspaces(self) -> list[WorkspaceInfo]:
        with self._db.session(write=False) as s:
            rows = s.scalars(select(m.Workspace).order_by(m.Workspace.created_at, m.Workspace.id))
            return [_workspace_info(obj) for obj in rows]

    @staticmethod
    def _workspace(s: Session, workspace_id: str) -> m.Workspace:
        obj = s.get(m.Workspace, workspace_id)
        if obj is None:
            raise NotFound(f"workspace {workspace_id} not found", details={"workspace_id": workspace_id})
        return obj

    # -- API keys --------------------------------------------------------------------------------------------

    def create_key(self, workspace_id: str, name: str = "") -> tuple[ApiKeyInfo, str]:
        """A new key for the workspace: ``(info, plaintext)``. The plaintext is not stored and cannot be recovered."""
        plaintext = keys.generate_key()
        with self._db.session(what=f"API key {name!r}") as s:
            self._workspace(s, workspace_id)
            obj = self._new_key(workspace_id, plaintext, name)
            s.add(obj)
            s.flush()
            return _key_info(obj), plaintext

    def import_key(self, workspace_id: str, plaintext: str, name: str = "") -> ApiKeyInfo:
        """Register a key chosen elsewhere (e.g. ``CRYOBOX_API_KEY``); idempotent.

        Importing a key that is already stored for the same workspace returns it unchanged (a revoked key stays
        revoked); a key that belongs to another workspace is refused.
        """
        if not plaintext or plaintext != plaintext.strip():
            raise InvalidArgument("an API key must be non-empty without surrounding whitespace")
        digest = keys.hash_key(plaintext)
        for _ in range(2):
            try:
                with self._db.session(what=f"API key {name!r}") as s:
                    self._workspace(s, workspace_id)
                    existing = s.scalar(select(m.ApiKey).where(m.ApiKey.hash == digest))
                    if existing is not None:
                        if existing.workspace_id != workspace_id:
                            raise InvalidArgument("this API key already belongs to another workspace")
                        return _key_info(existing)
                    obj = self._new_key(workspace_id, plaintext, name)
                    s.add(obj)
                    s.flush()
                    return _key_info(obj)
            except AlreadyExists:
                continue  # imported by a concurrent caller in between: read it
        raise AssertionError("unreachable: key neither found nor imported")  # pragma: no cover

    @staticmethod
    def _new_key(workspace_id: str, plaintext: str, name: str) -> m.ApiKey:
        return m.ApiKey(
            id=f"key-{secrets.token_hex(8)}",
            workspace_id=workspace_id,
            name=name,
            prefix=keys.key_prefix(plaintext),
            hash=keys.hash_key(plaintext),
            created_at=time.time(),
            revoked_at=None,
        )

    def authenticate(self, plaintext: str) -> WorkspaceInfo | None:
        """The workspace of a presented key, or ``None`` when the key is unknown or revoked."""
        if not plaintext:
            return None
        with self._db.session(write=False) as s:
            candidates = s.execute(
                select(m.ApiKey.hash, m.Workspace)
                .join(m.Workspace, m.Workspace.id == m.ApiKey.workspace_id)
                .where(m.ApiKey.prefix == keys.key_prefix(plaintext), m.ApiKey.revoked_at.is_(None))
            ).all()
            match: WorkspaceInfo | None = None
            for stored_hash, workspace in candidates:  # check all candidates: no early exit
                if keys.verify_key(plaintext, stored_hash):
                    match = _workspace_info(workspace)
            return match

    def list_keys(self, workspace_id: str | None = None) -> list[ApiKeyInfo]:
        query = select(m.ApiKey).order_by(m.ApiKey.created_at, m.ApiKey.id)
        if workspace_id is not None:
            query = query.where(m.ApiKey.workspace_id == workspace_id)
        with self._db.session(write=False) as s:
            return [_key_info(obj) for obj in s.scalars(query)]

    def revoke_key(self, key_id: str) -> ApiKeyInfo:
        """Revoke a key (idempotent: revoking again keeps the first ``revoked_at``)."""
        with self._db.session(what=f"API key {key_id}") as s:
            obj = s.get(m.ApiKey, key_id)
            if obj is None:
                raise NotFound(f"API key {key_id} not found", details={"key_id": key_id})
            if obj.revoked_at is None:
                obj.revoked_at = time.time()
            return _key_info(obj)

    # -- templates -------------------------------------------------------------------------------------------

    def upsert_template(self, row: TemplateRow) -> None:
        values = _check_fields(TemplateRow, {f.name: getattr(row, f.name) for f in fields(row)})
        for _ in range(2):
            try:
                with self._db.session(what=f"template {row.name!r}") as s:
                    obj = s.get(m.Template, row.name)
                    if obj is None:
                        s.add(m.Template(**values))
                    else:
                        for name, value in values.items():
                            setattr(obj, name, value)
                return
            except AlreadyExists:
                continue  # inserted by a concurrent caller in between: update it
        raise AssertionError("unreachable: template neither inserted nor updated")  # pragma: no cover

    def list_templates(self) -> list[TemplateRow]:
        with self._db.session(write=False) as s:
            return [_from_orm(obj, TemplateRow) for obj in s.scalars(select(m.Template).order_by(m.Template.name))]

    def update_template_status(self, name: str, status: str, error: str | None = None) -> None:
        """:raises NotFound: no such template."""
        with self._db.session(what=f"template {name!r}") as s:
            obj = s.get(m.Template, name)
            if obj is None:
                raise NotFound(f"template {name!r} not found", details={"template": name})
            obj.status = status
            obj.error = error

    def delete_template(self, name: str) -> None:
        """Idempotent."""
        with self._db.session(what=f"template {name!r}") as s:
            obj = s.get(m.Template, name)
            if obj is not None:
                s.delete(obj)

    def get_template(self, name: str) -> TemplateRow:
        with self._db.session(write=False) as s:
            obj = s.get(m.Template, name)
            if obj is None:
                raise NotFound(f"template {name!r} not found", details={"template": name})
            return _from_orm(obj, TemplateRow)

    # -- sandboxes -------------------------------------------------------------------------------------------

    def add_sandbox(self, row: SandboxRow) -> None:
        """Insert a sandbox; :class:`AlreadyExists` for a duplicate id, InvalidArgument for an unknown workspace."""
        with self._db.session(what=f"sandbox {row.id}") as s:
            s.add(envseal.to_orm(row, self._sealer))

    def update_sandbox(self, sandbox_id: str, **fields_: Any) -> SandboxRow:
        """Set some fields of a sandbox row and return the result. A ``status`` change to ``hibernated`` stamps
        ``hibernated_at`` (unless given); one to anything else clears it."""
        values = envseal.seal_changes(_changes(SandboxRow, fields_), self._sealer)
        with self._db.session(what=f"sandbox {sandbox_id}") as s:
            obj = s.get(m.Sandbox, sandbox_id)
            if obj is None:
                raise NotFound(f"sandbox {sandbox_id} not found", details={"sandbox_id": sandbox_id})
            if "status" in values and "hibernated_at" not in values:
                if values["status"] != HIBERNATED:
                    values["hibernated_at"] = None
                elif obj.status != HIBERNATED or obj.hibernated_at is None:
                    values["hibernated_at"] = time.time()
            for name, value in values.items():
                setattr(obj, _attr(name), value)
            envseal.reseal(obj, self._sealer)  # a row of an older version: sealed by its first update
            s.flush()
            return envseal.from_orm(obj, self._sealer)

    def get_sandbox(self, sandbox_id: str, workspace_id: str | None = None) -> SandboxRow:
        """The sandbox; NotFound also when it belongs to another workspace than ``workspace_id``."""
        with self._db.session(write=False) as s:
            obj = s.get(m.Sandbox, sandbox_id)
            if obj is None or (workspace_id is not None and obj.workspace_id != workspace_id):
                raise NotFound(f"sandbox {sandbox_id} not found", details={"sandbox_id": sandbox_id})
            return envseal.from_orm(obj, self._sealer)

    def list_sandboxes(
        self,
        workspace_id: str | None = None,
        status: str | None = None,
        metadata: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> list[SandboxRow]:
        """Sandboxes, oldest first; ``metadata`` keeps those whose metadata holds every given pair."""
        query = select(m.Sandbox).order_by(m.Sandbox.created_at, m.Sandbox.id)
        if workspace_id is not None:
            query = query.where(m.Sandbox.workspace_id == workspace_id)
        if status is not None:
            query = query.where(m.Sandbox.status == status)
        if host is not None:
            query = query.where(m.Sandbox.host == host)
        with self._db.session(write=False) as s:
            rows = [envseal.from_orm(obj, self._sealer) for obj in s.scalars(query)]
        return [row for row in rows if _subset(metadata, row.metadata)]

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Remove a sandbox row (idempotent). Its snapshots stay."""
        with self._db.session(what=f"sandbox {sandbox_id}") as s:
            s.execute(delete(m.Sandbox).where(m.Sandbox.id == sandbox_id))

    # -- snapshots -------------------------------------------------------------------------------------------

    def add_snapshot(self, row: SnapshotRow) -> None:
        with self._db.session(what=f"snapshot {row.id}") as s:
            s.add(_to_orm(row, m.Snapshot))

    def update_snapshot(self, snapshot_id: str, **fields_: Any) -> SnapshotRow:
        values = _changes(SnapshotRow, fields_)
        with self._db.session(what=f"snapshot {snapshot_id}") as s:
            obj = s.get(m.Snapshot, snapshot_id)
            if obj is None:
                raise NotFound(f"snapshot {snapshot_id} not found", details={"snapshot_id": snapshot_id})
            for name, value in values.items():
                setattr(obj, _attr(name), value)
            s.flush()
            return _from_orm(obj, SnapshotRow)

    def get_snapshot(self, snapshot_id: str, workspace_id: str | None = None) -> SnapshotRow:
        with self._db.session(write=False) as s:
            obj = s.get(m.Snapshot, snapshot_id)
            if obj is None or (workspace_id is not None and obj.workspace_id != workspace_id):
                raise NotFound(f"snapshot {snapshot_id} not found", details={"snapshot_id": snapshot_id})
            return _from_orm(obj, SnapshotRow)

    def list_snapshots(
        self,
        workspace_id: str | None = None,
        sandbox_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> list[SnapshotRow]:
        """Snapshots, newest first; ``labels`` keeps those whose labels hold every given pair."""
        query = select(m.Snapshot).order_by(m.Snapshot.created_at.desc(), m.Snapshot.id.desc())
        if workspace_id is not None:
            query = query.where(m.Snapshot.workspace_id == workspace_id)
        if sandbox_id is not None:
            query = query.where(m.Snapshot.sandbox_id == sandbox_id)
        if host is not None:
            query = query.where(m.Snapshot.host == host)
        with self._db.session(write=False) as s:
            rows = [_from_orm(obj, SnapshotRow) for obj in s.scalars(query)]
        return [row for row in rows if _subset(labels, row.labels)]

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot row (idempotent)."""
        with self._db.session(what=f"snapshot {snapshot_id}") as s:
            s.execute(delete(m.Snapshot).where(m.Snapshot.id == snapshot_id))

    # -- crash consistency -----------------------------------------------------------------------------------

    def reconcile(
        self, snapshot_dir_exists: Callable[[str], bool], live_sandbox_ids: set[str], *, host: str
    ) -> ReconcileReport:
        """Make the rows of ``host`` (only those: other hosts' rows are never touched) agree with it after a restart.

        The host's ``local`` snapshot rows whose files are gone are deleted (``stored`` ones stay: their files live
        in the object store); the host's sandbox rows not in ``live_sandbox_ids`` whose status is not
        ``stopped``/``error`` are marked ``stopped`` (their VMs did not survive). Run it at start-up, before
        serving requests, so no snapshot is being written while its directory is checked.
        """
        local = (m.Snapshot.host == host, m.Snapshot.location == "local")
        with self._db.session(write=False) as s:
            snapshots = s.execute(select(m.Snapshot.id, m.Snapshot.path).where(*local)).all()
        gone = sorted(snapshot_id for snapshot_id, path in snapshots if not snapshot_dir_exists(path))
        with self._db.session(what="registry reconciliation") as s:
            for chunk in _chunks(gone):
                s.execute(delete(m.Snapshot).where(m.Snapshot.id.in_(chunk), *local))
            active = s.scalars(
                select(m.Sandbox.id).where(m.Sandbox.host == host, m.Sandbox.status.not_in(STOPPED_STATUSES))
            ).all()
            dead = sorted(set(active) - live_sandbox_ids)
            for chunk in _chunks(dead):
                s.execute(
                    update(m.Sandbox).where(m.Sandbox.id.in_(chunk), m.Sandbox.host == host).values(status="stopped")
                )
        return ReconcileReport(deleted_snapshots=gone, stopped_sandboxes=dead)
