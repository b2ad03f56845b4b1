"""The registries a store GC consults, on real databases (SQLite files and a throwaway PostgreSQL): what a registry
that announced itself holds, and when it reads as gone or cannot be judged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, event

from cryobox.objstore.client import open_store
from cryobox.objstore.owners import record_key
from cryobox.registry import Registry, TemplateRow
from cryobox.registry import models as m
from cryobox.registry.oracle import RegistryOracle, machine_id
from cryobox.registry.rows import _to_orm
from cryobox.server.control.ownership import StoreOwnership, registry_record
from tests.support import registry as registry_support
from tests.support.registry import migrated, sandbox, snapshot

pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry


def filled(reg: Registry) -> None:
    ws = reg.ensure_workspace("default").id
    reg.add_sandbox(sandbox("sb-1", ws))
    reg.add_snapshot(snapshot("snap-1", ws))
    reg.upsert_template(TemplateRow(name="tpl", generation="g1", cpus=1, memory_mib=256, status="ready", path="/t"))


def test_a_registry_lists_its_snapshots_and_sandboxes(registry: Registry, db_url: str) -> None:
    filled(registry)
    record = registry_record(registry, "m1")
    oracle = RegistryOracle("m1", [db_url] if record.kind == "postgres" else [])
    listing = oracle.consult(record)
    assert listing.state == "live"
    assert listing.verdict("snapshots", "snap-1") == "listed" and listing.verdict("hibernations", "sb-1") == "listed"
    assert listing.verdict("snapshots", "snap-2") == listing.verdict("hibernations", "sb-2") == "unlisted"
    assert listing.verdict("templates", "tpl") == "listed" and listing.verdict("templates", "other") == "unlisted"
    registry.delete_snapshot("snap-1")
    assert oracle.consult(record).verdict("snapshots", "snap-1") == "unlisted"


def test_a_commit_during_the_read_cannot_hide_what_it_moves(registry: Registry, db_url: str) -> None:
    """A commit that moves a reference between tables while the registry is read: the listing shows it before or
    after the move, never nowhere. Read table by table, the commit landed between two statements (PostgreSQL gives
    each its own snapshot, SQLite read each outside a transaction) and the reference was in neither."""
    filled(registry)
    ws = registry.ensure_workspace("default").id
    registry.add_sandbox(sandbox("sb-moving", ws))
    record = registry_record(registry, "m1")
    oracle = RegistryOracle("m1", [db_url] if record.kind == "postgres" else [])
    moved: list[str] = []

    def move_during_the_read(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if moved or "FROM snapshots" not in statement:
            return
        moved.append(statement)
        with registry.database.session() as s:  # one transaction: the sandbox's image becomes a snapshot's
            s.execute(delete(m.Sandbox).where(m.Sandbox.id == "sb-moving"))
            s.add(_to_orm(snapshot("snap-moved", ws), m.Snapshot))

    event.listen(Engine, "after_cursor_execute", move_during_the_read)
    try:
        listing = oracle.consult(record)
    finally:
        event.remove(Engine, "after_cursor_execute", move_during_the_read)
    assert moved, "the move was never made during the read"
    assert listing.state == "live"
    assert "sb-moving" in listing.sandboxes or "snap-moved" in listing.snapshots
    assert oracle.consult(record).verdict("snapshots", "snap-moved") == "listed"  # and the next read sees it moved


def test_a_registry_this_run_cannot_judge_is_unknown(registry: Registry, db_url: str) -> None:
    record = registry_record(registry, "m1")
    assert RegistryOracle("m2", []).consult(record).state == "unknown"  # SQLite: another machine's file
    if record.kind == "postgres":  # a PostgreSQL registry this run was not given
        assert RegistryOracle("m1", []).consult(record).state == "unknown"


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Iterator[tuple[Registry, Path]]:
    path = tmp_path / "data" / "registry.sqlite"
    yield from ((reg, path) for reg in migrated(f"sqlite:///{path}"))


def test_a_sqlite_registry_whose_file_is_deleted_or_replaced_is_gone(sqlite_file: tuple[Registry, Path]) -> None:
    reg, path = sqlite_file
    record = registry_record(reg, "m1")
    assert record.kind == "sqlite" and record.locator == str(path.resolve())
    oracle = RegistryOracle("m1")
    assert oracle.consult(record).state == "live"
    reg.close()
    for p in path.parent.glob("registry.sqlite*"):
        p.unlink()
    assert oracle.consult(record).state == "gone"
    assert not path.exists(), "consulting a gone registry must not create its file"
    for other in migrated(f"sqlite:///{path}"):  # a data dir made again at the same path: another registry
        assert other.identity() != record.id
        assert oracle.consult(record).state == "gone"


def test_a_registry_announces_itself_in_the_store(sqlite_file: tuple[Registry, Path], tmp_path: Path) -> None:
    reg, _ = sqlite_file
    store = open_store(f"file://{tmp_path / 'store'}")
    ownership = StoreOwnership.announced(store, reg, machine_id())
    assert store.list("owners") == [record_key(reg.identity())]
    ownership.claim("snapshots/snap-1")
    assert f"owners/{reg.identity()}/snapshots/snap-1" in store.list("owners")
    ownership.release("snapshots/snap-1")
    ownership.release("snapshots/snap-1")  # idempotent
    assert store.list("owners") == [record_key(reg.identity())]
