"""Alembic environment of the cryobox registry.

Normally run programmatically by :meth:`cryobox.registry.db.Database.migrate`, which hands over an open connection
(already inside a transaction, holding the migration lock) in ``config.attributes["connection"]``. For development,
``alembic -x`` style use also works with ``sqlalchemy.url`` set on the config, online or offline (``--sql``).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from cryobox.registry.models import Base

TARGET_METADATA = Base.metadata


def _run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=TARGET_METADATA,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTER TABLE needs batch mode
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    from cryobox.registry.db import make_engine

    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection in config.attributes['connection']")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run_with(conn)
    finally:
        engine.dispose()


def run_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=TARGET_METADATA,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
