"""Registries for unit tests (a plain module, not a conftest): fixtures, row builders and the clock fixture.

Fixtures are shared by binding them into a test module under the name its tests ask for (pytest finds them by
that name; the module is imported as ``from tests.support import registry as registry_support``), e.g.
``registry = registry_support.sqlite_registry`` for a SQLite registry, or, to run a module on
both backends, ``pg_server``, ``db_url`` and ``registry`` (SQLite and a real throwaway PostgreSQL, ``pg.py``);
``clock = registry_support.clock`` for a :class:`~tests.support.clock.FakeClock` at :data:`~tests.support.clock.T0`.

:func:`open_registry` is ``Registry(url)`` with, for PostgreSQL (which has no key file), the key every replica
of a test shares; a SQLite registry keeps its default key file beside the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cryobox.registry import Registry, SandboxRow, SnapshotRow
from cryobox.util.sealing import Sealer, generate_key
from tests.support.clock import T0, FakeClock
from tests.support.pg import PostgresServer, throwaway_postgres

PG_KEY = generate_key()
"""The sealing key of the PostgreSQL registries of this test session (SQLite ones use their key file)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


def open_registry(url: str) -> Registry:
    """``Registry(url)``; on PostgreSQL sealing with :data:`PG_KEY`."""
    return Registry(url, None if url.startswith("sqlite") else Sealer.from_keys(PG_KEY, "the test key"))


def migrated(url: str) -> Iterator[Registry]:
    """A :class:`Registry` on ``url`` with the schema applied; closed afterwards (the body of a fixture)."""
    reg = open_registry(url)
    try:
        reg.migrate()
        yield reg
    finally:
        reg.close()


@pytest.fixture
def sqlite_registry(tmp_path: Path) -> Iterator[Registry]:
    """A registry on a SQLite file in ``tmp_path``."""
    yield from migrated(f"sqlite:///{tmp_path / 'registry.sqlite'}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with throwaway_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each backend (PostgreSQL: a fresh database per test, dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db' / 'registry.sqlite'}"
        return
    server: PostgresServer = request.getfixturevalue("pg_server")
    with server.database() as url:
        yield url


@pytest.fixture
def registry(db_url: str) -> Iterator[Registry]:
    """A registry on ``db_url`` (each backend in turn)."""
    yield from migrated(db_url)


def sandbox(sandbox_id: str, workspace_id: str, **kw: Any) -> SandboxRow:
    kw.setdefault("memory_mib", 512)
    return SandboxRow(id=sandbox_id, workspace_id=workspace_id, template="code-interpreter", cpus=1, **kw)


def snapshot(snapshot_id: str, workspace_id: str, path: str = "/nowhere", **kw: Any) -> SnapshotRow:
    return SnapshotRow(id=snapshot_id, workspace_id=workspace_id, template="code-interpreter", path=path, **kw)
