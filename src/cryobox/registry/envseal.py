"""A sandbox's ``env`` at rest in the registry: sealed on every write, opened on every read.

The ``sandboxes.env`` JSON column holds a sealed token (a JSON *string*, :mod:`cryobox.util.sealing`). Rows of
older versions hold the plain mapping (a JSON *object*): they still read, are re-sealed by the row's next update,
and are swept by :func:`seal_plaintext` whenever the registry migrates. No schema change, so no revision.

The registry's key (:func:`registry_sealer`): ``CRYOBOX_SECRET_KEY`` if set, else a key file created on first
use: ``secrets/registry.key`` beside the SQLite database file (``<data dir>/secrets/registry.key`` by default),
or, for PostgreSQL, in the data dir. An in-memory SQLite database gets an ephemeral key; a PostgreSQL URL without
a data dir has none unless ``CRYOBOX_SECRET_KEY`` is set. Replicas sharing one PostgreSQL must share the key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy import Text, cast, select, update

from ..util.sealing import SECRET_KEY_ENV, Sealer
from . import models as m
from .db import Database, _parse
from .rows import _CHUNK, SandboxRow, _from_orm, _to_orm

log = logging.getLogger(__name__)

KEY_FILE = Path("secrets") / "registry.key"
"""The registry's key file, relative to the data dir (or to the SQLite file's directory)."""


def registry_sealer(url: str, data_dir: Path | None = None, env: Mapping[str, str] | None = None) -> Sealer:
    """The sealer of the registry on ``url`` (see the module's docstring); ``env`` defaults to ``os.environ``."""
    env = os.environ if env is None else env
    configured = bool(env.get(SECRET_KEY_ENV, "").strip())
    parsed = _parse(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
            return Sealer.load(None, env) if configured else Sealer.ephemeral()
        return Sealer.load(Path(database).parent / KEY_FILE, env)
    if data_dir is not None:
        if backend == "postgresql" and not configured:
            log.warning(
                "sandbox env in the PostgreSQL registry is sealed with %s: every control-plane replica needs the "
                "same key, so set %s on all of them",
                data_dir / KEY_FILE,
                SECRET_KEY_ENV,
            )
        return Sealer.load(data_dir / KEY_FILE, env)
    where = parsed.render_as_string(hide_password=True)
    return Sealer.load(None, env, why=f"a registry on {where} without a data dir needs {SECRET_KEY_ENV}")


def _what(sandbox_id: str) -> str:
    return f"the env of sandbox {sandbox_id}"


def to_orm(row: SandboxRow, sealer: Sealer) -> m.Sandbox:
    """The ORM object of a new sandbox row, its env sealed."""
    obj = _to_orm(row, m.Sandbox)
    assert isinstance(obj, m.Sandbox)
    obj.env = sealer.seal(row.env)
    return obj


def from_orm(obj: m.Sandbox, sealer: Sealer) -> SandboxRow:
    """The row of a sandbox, its env opened (:class:`~cryobox.errors.SecretUnreadable` if it cannot be)."""
    return replace(_from_orm(obj, SandboxRow), env=sealer.open_stored(obj.env, what=_what(obj.id)))


def seal_changes(values: Mapping[str, Any], sealer: Sealer) -> dict[str, Any]:
    """Checked :class:`SandboxRow` changes (``_check_fields``) with ``env``, if there, sealed."""
    if "env" not in values:
        return dict(values)
    return {**values, "env": sealer.seal(values["env"])}


def reseal(obj: m.Sandbox, sealer: Sealer) -> None:
    """Seal the env of a row written before sealing existed (a no-op for a sealed one)."""
    if not isinstance(obj.env, str):
        obj.env = sealer.seal(sealer.open_stored(obj.env, what=_what(obj.id)))


def seal_plaintext(db: Database, sealer: Sealer) -> list[str]:
    """Seal every env still stored as a plain mapping (rows of older versions); the ids sealed, sorted.

    Idempotent and safe against concurrent callers (a row sealed twice is still sealed). Values that are neither
    a mapping nor a token are left for the reads to report.
    """
    plain = cast(m.Sandbox.env, Text).like("{%")  # a JSON object, not the JSON string of a token
    sealed: list[str] = []
    while True:
        with db.session(write=False) as s:
            batch = s.execute(select(m.Sandbox.id, m.Sandbox.env).where(plain).order_by(m.Sandbox.id).limit(_CHUNK))
            legacy = [(sandbox_id, env) for sandbox_id, env in batch if isinstance(env, dict)]
        if not legacy:
            break
        with db.session(what="sealing sandbox env") as s:
            for sandbox_id, env in legacy:
                token = sealer.seal(sealer.open_stored(env, what=_what(sandbox_id)))
                s.execute(update(m.Sandbox).where(m.Sandbox.id == sandbox_id, plain).values(env=token))
        sealed += [sandbox_id for sandbox_id, _ in legacy]
    if sealed:
        log.info("sealed the plaintext env of %d sandbox row(s)", len(sealed))
    return sorted(sealed)
