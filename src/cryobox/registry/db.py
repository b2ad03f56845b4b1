"""Engine, sessions and migrations of the registry database (SQLite file or PostgreSQL via psycopg 3).

SQLite runs in WAL mode with foreign keys on, and SQLAlchemy (not the ``sqlite3`` module) emits ``BEGIN``: writing
sessions start with ``BEGIN IMMEDIATE`` so concurrent writers queue on the busy timeout instead of failing on a
lock upgrade, reading sessions with a plain deferred ``BEGIN`` that never blocks in WAL mode. The engine may be
used from many threads (the server calls the registry through ``asyncio.to_thread``).

SQLAlchemy errors are translated into cryobox errors here, at one boundary: :meth:`Database.session`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import ArgumentError, DataError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from ..errors import CryoboxError, InvalidArgument

if TYPE_CHECKING:
    from alembic.config import Config

DATABASE_URL_ENV = "CRYOBOX_DATABASE_URL"
SQLITE_FILENAME = "registry.sqlite"
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_S = 30.0
_PG_MIGRATION_LOCK = 0x63627872  # pg_advisory_xact_lock key serializing concurrent migrations ("cbxr")
_SQLITE_BEGIN = "cryobox_sqlite_begin"  # execution option: the BEGIN flavour of a SQLite transaction


class AlreadyExists(InvalidArgument):
    """A row with the same primary key or unique value is already stored (wire code ``invalid_argument``)."""


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for bare ``postgresql://`` (and ``postgres://``) URLs."""
    url = url.strip()
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url


def url_for_data_dir(data_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """``CRYOBOX_DATABASE_URL`` if set, else the SQLite file ``data_dir/registry.sqlite``."""
    env = os.environ if env is None else env
    configured = env.get(DATABASE_URL_ENV, "").strip()
    if configured:
        return normalize_url(configured)
    return URL.create("sqlite", database=str(data_dir / SQLITE_FILENAME)).render_as_string()


def _parse(url: str) -> URL:
    try:
        return make_url(normalize_url(url))
    except ArgumentError as err:
        raise InvalidArgument(f"invalid database URL {url!r}: {err}") from err


def make_engine(url: str) -> Engine:
    """An engine for ``sqlite:///<file>`` (or in-memory) or ``postgresql+psycopg://...``."""
    parsed = _parse(url)
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            database = parsed.database or ""
            in_memory = database in ("", ":memory:") or parsed.query.get("mode") == "memory"
            if not in_memory:
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(
                parsed,
                connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
                # one shared connection, or every thread would see its own empty in-memory database
                **({"poolclass": StaticPool} if in_memory else {}),
            )
            _configure_sqlite(engine, wal=not in_memory)
            return engine
        if backend == "postgresql":
            return create_engine(parsed, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError, ImportError) as err:
        raise InvalidArgument(f"cannot use database URL {parsed.render_as_string()!r}: {err}") from err
    raise InvalidArgument(
        f"unsupported database {backend!r} in {parsed.render_as_string()!r}: use sqlite:///<path> or postgresql://..."
    )


def _configure_sqlite(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy emit BEGIN (see _on_begin)
        cursor = dbapi_connection.cursor()
        try:
            if wal:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_SQLITE_BEGIN, "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _db_message(err: SQLAlchemyError) -> str:
    orig = getattr(err, "orig", None)
    text_ = str(orig if orig is not None else err).strip()
    return text_.splitlines()[0] if text_ else type(err).__name__


def _translate(err: SQLAlchemyError, what: str) -> CryoboxError:
    message = _db_message(err)
    details = {"db_error": message}
    if isinstance(err, IntegrityError):
        sqlstate = getattr(err.orig, "sqlstate", None)
        lowered = message.lower()
        if sqlstate == "23505" or "unique constraint" in lowered:
            return AlreadyExists(f"{what} already exists", details=details)
        if sqlstate == "23503" or "foreign key constraint" in lowered:
            return InvalidArgument(f"{what} refers to a row that does not exist (unknown workspace?)", details=details)
        if sqlstate == "23502" or "not null constraint" in lowered:
            return InvalidArgument(f"{what} lacks a required value", details=details)
        return InvalidArgument(f"{what} violates a registry constraint", details=details)
    if isinstance(err, DataError):
        return InvalidArgument(f"{what} has a value the database cannot store", details=details)
    return CryoboxError(f"registry database error on {what}: {message}", details=details)


class Database:
    """One engine plus short-lived sessions; safe to share between threads."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self._writer = sessionmaker(bind=self.engine, expire_on_commit=False)
        self._reader_bind = self.engine
        if self.dialect == "sqlite":
            self._reader_bind = self.engine.execution_options(**{_SQLITE_BEGIN: "DEFERRED"})
        self._reader = sessionmaker(bind=self._reader_bind, expire_on_commit=False)

    @property
    def writer(self) -> sessionmaker[Session]:
        """The factory of writing sessions (what :mod:`.watch` listens to)."""
        return self._writer

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def session(self, *, write: bool = True, what: str = "registry record") -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back on any exception.

        SQLAlchemy errors leave as cryobox errors (``IntegrityError`` -> :class:`AlreadyExists` or
        :class:`InvalidArgument`); ``what`` names the object for their messages.
        """
        maker = self._writer if write else self._reader
        try:
            with maker.begin() as session:
                yield session
        except SQLAlchemyError as err:
            raise _translate(err, what) from err

    def _alembic_config(self) -> Config:
        from alembic.config import Config  # Alembic is imported when migrating, not with the registry

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.set_main_option("path_separator", "os")
        return cfg

    def migrate(self) -> None:
        """``alembic upgrade head`` on this engine; idempotent and safe against concurrent callers."""
        from alembic import command

        cfg = self._alembic_config()
        try:
            with self.engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, i.e. the write lock
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except SQLAlchemyError as err:
            raise _translate(err, "schema migration") from err

    def current_revision(self) -> str | None:
        """The Alembic revision the database is at (``None`` before the first :meth:`migrate`)."""
        from alembic.runtime.migration import MigrationContext

        try:
            with self._reader_bind.connect() as conn:
                return MigrationContext.configure(conn).get_current_revision()
        except SQLAlchemyError as err:
            raise _translate(err, "schema revision") from err

    def head_revision(self) -> str | None:
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self._alembic_config()).get_current_head()

    def close(self) -> None:
        self.engine.dispose()
