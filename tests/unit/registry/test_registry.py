"""The registry on both backends: SQLite (a file in tmp_path) and a real throwaway PostgreSQL (see
``tests/support/pg.py``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import select

from cryobox.errors import InvalidArgument, NotFound
from cryobox.registry import AlreadyExists, Registry, TemplateRow, normalize_url, url_for_data_dir
from cryobox.registry.models import Base
from tests.support import registry as registry_support
from tests.support.registry import sandbox, snapshot

# the shared fixtures (registry_support), bound here under the names the tests ask for
pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry


# -- schema ------------------------------------------------------------------------------------------------------


def test_migrate_twice_is_idempotent_and_matches_models(db_url: str) -> None:
    with Registry(db_url) as reg:
        assert reg.database.current_revision() is None
        assert not reg.migrated_already()  # an upgrade's successor then migrates after the hand-over
        assert reg.database.current_revision() is None  # and the check wrote no schema
        reg.migrate()
        reg.migrate()
        head = reg.database.head_revision()
        assert head is not None
        assert reg.database.current_revision() == head
        ws = reg.ensure_workspace("kept")
        with reg.database.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == [], f"models.py and the migrations disagree: {diff}"
        if reg.database.dialect == "sqlite":
            with reg.database.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    with Registry(db_url) as again:  # a second process starting up
        assert again.migrated_already()
        again.migrate()
        assert again.database.current_revision() == head
        assert again.list_workspaces() == [ws]


def test_unsupported_url_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="unsupported database"):
        Registry("mysql://user@localhost/db")
    with pytest.raises(InvalidArgument, match="invalid database URL"):
        Registry("not a url")


# -- workspaces and keys ------------------------------------------------------------------------------------------


def test_workspaces(registry: Registry) -> None:
    a = registry.ensure_workspace("alpha")
    assert a.id.startswith("ws-") and a.name == "alpha"
    assert registry.ensure_workspace("alpha") == a
    b = registry.ensure_workspace("beta")
    assert registry.get_workspace(b.id) == b
    assert [w.name for w in registry.list_workspaces()] == ["alpha", "beta"]
    with pytest.raises(NotFound):
        registry.get_workspace("ws-missing")
    with pytest.raises(InvalidArgument):
        registry.ensure_workspace("  ")


def test_concurrent_ensure_workspace_creates_one(registry: Registry) -> None:
    results: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(registry.ensure_workspace("shared").id)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert len(results) == 8 and len(set(results)) == 1
    assert len(registry.list_workspaces()) == 1


def test_key_create_authenticate_revoke(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    other = registry.ensure_workspace("other")
    info, plaintext = registry.create_key(ws.id, "ci")
    assert plaintext.startswith("cbx_") and len(plaintext) >= 40
    assert info.id.startswith("key-") and info.prefix == plaintext[:12] and info.name == "ci"
    assert not info.revoked
    assert registry.authenticate(plaintext) == ws

    # wrong secret with the right prefix, unknown keys, empty input
    assert registry.authenticate(plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")) is None
    assert registry.authenticate("cbx_unknown") is None
    assert registry.authenticate("") is None

    _, other_plain = registry.create_key(other.id)
    assert registry.authenticate(other_plain) == other
    assert [k.id for k in registry.list_keys(ws.id)] == [info.id]
    assert len(registry.list_keys()) == 2
    assert not hasattr(info, "hash")

    revoked = registry.revoke_key(info.id)
    assert revoked.revoked and revoked.revoked_at is not None
    assert registry.authenticate(plaintext) is None
    assert registry.revoke_key(info.id) == revoked  # idempotent: the first revocation time stays
    assert registry.authenticate(other_plain) == other
    with pytest.raises(NotFound):
        registry.revoke_key("key-missing")
    with pytest.raises(NotFound):
        registry.create_key("ws-missing")


def test_plaintext_is_never_stored(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    _, created = registry.create_key(ws.id, "created")
    imported = "cbx_imported-" + "x" * 40
    registry.import_key(ws.id, imported, "imported")
    secrets_ = [created, created[12:], imported, imported[12:]]  # the 12-char prefix alone is stored by design
    cells = 0
    with registry.database.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            for row in conn.execute(select(table)):
                for value in row:
                    cells += 1
                    assert not any(s in str(value) for s in secrets_), f"{table.name} stores a key: {value!r}"
    assert cells > 0
    db_file = registry.database.engine.url.database
    if registry.database.dialect == "sqlite" and db_file:
        for path in Path(db_file).parent.glob(Path(db_file).name + "*"):  # the database, its WAL and shm files
            raw = path.read_bytes()
            assert not any(s.encode() in raw for s in secrets_), f"{path.name} contains a plaintext key"


def test_import_key_is_idempotent(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    other = registry.ensure_workspace("other")
    key = "cbx_from-the-environment-0123456789"
    first = registry.import_key(ws.id, key, "env")
    assert registry.import_key(ws.id, key, "env") == first
    assert registry.list_keys(ws.id) == [first]
    assert registry.authenticate(key) == ws
    with pytest.raises(InvalidArgument, match="another workspace"):
        registry.import_key(other.id, key)
    with pytest.raises(InvalidArgument):
        registry.import_key(ws.id, "")
    with pytest.raises(NotFound):
        registry.import_key("ws-missing", "cbx_whatever-key")
    registry.revoke_key(first.id)
    assert registry.import_key(ws.id, key).revoked  # a revoked key stays revoked
    assert registry.authenticate(key) is None


# -- templates -------------------------------------------------------------------------------------------------


def test_templates_upsert(registry: Registry) -> None:
    row = TemplateRow(name="code-interpreter", generation="g1", cpus=1, memory_mib=512, status="building", path="/t/a")
    registry.upsert_template(row)
    assert registry.get_template("code-interpreter") == row
    newer = TemplateRow(name="code-interpreter", generation="g2", cpus=2, memory_mib=1024, status="ready", path="/t/b")
    registry.upsert_template(newer)
    registry.upsert_template(TemplateRow(name="base", generation="g", cpus=1, memory_mib=256, status="ready", path="/"))
    assert [t.name for t in registry.list_templates()] == ["base", "code-interpreter"]
    assert registry.get_template("code-interpreter") == newer
    with pytest.raises(NotFound):
        registry.get_template("missing")


# -- sandboxes -------------------------------------------------------------------------------------------------


def test_workspace_isolation(registry: Registry) -> None:
    a = registry.ensure_workspace("a")
    b = registry.ensure_workspace("b")
    registry.add_sandbox(sandbox("sbx-a", a.id, created_at=1.0))
    registry.add_sandbox(sandbox("sbx-b", b.id, created_at=2.0))
    assert registry.get_sandbox("sbx-a", a.id).workspace_id == a.id
    assert registry.get_sandbox("sbx-a").id == "sbx-a"
    with pytest.raises(NotFound):
        registry.get_sandbox("sbx-a", b.id)
    with pytest.raises(NotFound):
        registry.get_sandbox("sbx-missing")
    assert [s.id for s in registry.list_sandboxes(a.id)] == ["sbx-a"]
    assert [s.id for s in registry.list_sandboxes(b.id)] == ["sbx-b"]
    assert [s.id for s in registry.list_sandboxes()] == ["sbx-a", "sbx-b"]


def test_sandbox_filters_and_order(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    registry.add_sandbox(sandbox("sbx-3", ws.id, created_at=30.0, status="running", metadata={"team": "x", "k": "1"}))
    registry.add_sandbox(sandbox("sbx-1", ws.id, created_at=10.0, status="running", metadata={"team": "x"}))
    registry.add_sandbox(sandbox("sbx-2", ws.id, created_at=20.0, status="stopped", metadata={"team": "y"}))
    assert [s.id for s in registry.list_sandboxes(ws.id)] == ["sbx-1", "sbx-2", "sbx-3"]
    assert [s.id for s in registry.list_sandboxes(status="running")] == ["sbx-1", "sbx-3"]
    assert [s.id for s in registry.list_sandboxes(metadata={"team": "x"})] == ["sbx-1", "sbx-3"]
    assert [s.id for s in registry.list_sandboxes(metadata={"team": "x", "k": "1"})] == ["sbx-3"]
    assert [s.id for s in registry.list_sandboxes(status="stopped", metadata={"team": "x"})] == []
    assert registry.list_sandboxes(metadata={"absent": ""}) == []


def test_add_update_delete_sandbox(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    registry.add_sandbox(sandbox("sbx-1", ws.id))
    with pytest.raises(AlreadyExists, match="sbx-1 already exists"):
        registry.add_sandbox(sandbox("sbx-1", ws.id))
    with pytest.raises(InvalidArgument, match="does not exist"):
        registry.add_sandbox(sandbox("sbx-2", "ws-missing"))

    updated = registry.update_sandbox("sbx-1", status="running", boot_ms=12, vm_id="vm-1", guest_ip="10.0.0.2")
    assert (updated.status, updated.boot_ms, updated.vm_id, updated.guest_ip) == ("running", 12.0, "vm-1", "10.0.0.2")
    assert registry.get_sandbox("sbx-1") == updated
    with pytest.raises(InvalidArgument, match="unknown SandboxRow field"):
        registry.update_sandbox("sbx-1", colour="blue")
    with pytest.raises(InvalidArgument, match="cannot change"):
        registry.update_sandbox("sbx-1", workspace_id="ws-other")
    with pytest.raises(InvalidArgument, match="must be"):
        registry.update_sandbox("sbx-1", cpus="two")
    with pytest.raises(InvalidArgument, match="must be"):
        registry.update_sandbox("sbx-1", metadata={"k": 1})
    with pytest.raises(NotFound):
        registry.update_sandbox("sbx-missing", status="running")
    assert registry.get_sandbox("sbx-1") == updated  # failed updates changed nothing

    registry.delete_sandbox("sbx-1")
    registry.delete_sandbox("sbx-1")  # idempotent
    with pytest.raises(NotFound):
        registry.get_sandbox("sbx-1")


def test_json_columns_round_trip(registry: Registry) -> None:
    ws = registry.ensure_workspace("default")
    metadata = {"unicode": "héllo ✓ 日本", "quote": "\"'\\", "empty": "", "nested-looking": '{"a": [1]}'}
    env = {"PATH": "/usr/bin:/bin", "MULTILINE": "a\nb"}
    row = sandbox(
        "sbx-json",
        ws.id,
        metadata=metadata,
        env=env,
        created_at=1_700_000_000.123456,
        last_active_at=1_700_000_001.654321,
        persistent=True,
        ttl_s=600,
        expires_at=1_700_000_601.5,
        from_snapshot="snap-1",
    )
    registry.add_sandbox(row)
    assert registry.get_sandbox("sbx-json") == row
    assert registry.update_sandbox("sbx-json", env={}).env == {}
    labels = {"release": "v1", "ünï": "çödé"}
    snap = snapshot("snap-json", ws.id, labels=labels, size_bytes=5 << 30, pause_ms=12.5, retain=True)
    registry.add_snapshot(snap)
    assert registry.get_snapshot("snap-json") == snap


# -- snapshots -------------------------------------------------------------------------------------------------


def test_snapshots_newest_first_and_filters(registry: Registry) -> None:
    a = registry.ensure_workspace("a")
    b = registry.ensure_workspace("b")
    registry.add_sandbox(sandbox("sbx-1", a.id))
    registry.add_snapshot(snapshot("snap-old", a.id, sandbox_id="sbx-1", created_at=1.0, labels={"env": "prod"}))
    registry.add_snapshot(
        snapshot("snap-new", a.id, sandbox_id="sbx-1", created_at=3.0, labels={"env": "prod", "v": "2"})
    )
    registry.add_snapshot(snapshot("snap-mid", a.id, created_at=2.0, labels={"env": "dev"}, parent_id="snap-old"))
    registry.add_snapshot(snapshot("snap-b", b.id, created_at=4.0))
    assert [s.id for s in registry.list_snapshots(a.id)] == ["snap-new", "snap-mid", "snap-old"]
    assert [s.id for s in registry.list_snapshots()] == ["snap-b", "snap-new", "snap-mid", "snap-old"]
    assert [s.id for s in registry.list_snapshots(labels={"env": "prod"})] == ["snap-new", "snap-old"]
    assert [s.id for s in registry.list_snapshots(labels={"env": "prod", "v": "2"})] == ["snap-new"]
    assert [s.id for s in registry.list_snapshots(sandbox_id="sbx-1")] == ["snap-new", "snap-old"]
    with pytest.raises(NotFound):
        registry.get_snapshot("snap-old", b.id)
    assert registry.get_snapshot("snap-mid", a.id).parent_id == "snap-old"

    registry.delete_sandbox("sbx-1")  # snapshots outlive their sandbox (no foreign key)
    orphaned = registry.update_snapshot("snap-old", orphaned_at=5.0)
    assert orphaned.orphaned_at == 5.0 and orphaned.sandbox_id == "sbx-1"
    with pytest.raises(InvalidArgument):
        registry.update_snapshot("snap-old", sandbox="x")
    with pytest.raises(NotFound):
        registry.update_snapshot("snap-missing", retain=True)
    with pytest.raises(AlreadyExists):
        registry.add_snapshot(snapshot("snap-old", a.id))
    registry.delete_snapshot("snap-old")
    registry.delete_snapshot("snap-old")
    assert [s.id for s in registry.list_snapshots(a.id)] == ["snap-new", "snap-mid"]


# -- crash consistency ---------------------------------------------------------------------------------------


def test_reconcile(registry: Registry, tmp_path: Path) -> None:
    ws = registry.ensure_workspace("default")
    kept_dir = tmp_path / "snapshots" / "snap-kept"
    kept_dir.mkdir(parents=True)
    registry.add_snapshot(snapshot("snap-kept", ws.id, path=str(kept_dir)))
    registry.add_snapshot(snapshot("snap-gone", ws.id, path=str(tmp_path / "snapshots" / "snap-gone")))
    for sandbox_id, status in [
        ("sbx-live", "running"),
        ("sbx-dead-running", "running"),
        ("sbx-dead-starting", "starting"),
        ("sbx-dead-paused", "paused"),
        ("sbx-stopped", "stopped"),
        ("sbx-error", "error"),
    ]:
        registry.add_sandbox(sandbox(sandbox_id, ws.id, status=status))

    def exists(path: str) -> bool:
        return Path(path).is_dir()

    report = registry.reconcile(exists, live_sandbox_ids={"sbx-live"}, host="")
    assert report.deleted_snapshots == ["snap-gone"]
    assert report.stopped_sandboxes == ["sbx-dead-paused", "sbx-dead-running", "sbx-dead-starting"]
    assert [s.id for s in registry.list_snapshots()] == ["snap-kept"]
    statuses = {s.id: s.status for s in registry.list_sandboxes()}
    assert statuses == {
        "sbx-live": "running",
        "sbx-dead-running": "stopped",
        "sbx-dead-starting": "stopped",
        "sbx-dead-paused": "stopped",
        "sbx-stopped": "stopped",
        "sbx-error": "error",
    }
    again = registry.reconcile(exists, live_sandbox_ids={"sbx-live"}, host="")
    assert (again.deleted_snapshots, again.stopped_sandboxes) == ([], [])


# -- configuration -------------------------------------------------------------------------------------------


def test_for_data_dir_honours_database_url(db_url: str, tmp_path: Path) -> None:
    configured = db_url
    if db_url.startswith("postgresql+psycopg://"):
        configured = "postgresql://" + db_url.removeprefix("postgresql+psycopg://")  # as an operator writes it
    with Registry.for_data_dir(tmp_path / "data", env={"CRYOBOX_DATABASE_URL": configured}) as reg:
        assert reg.url.startswith("sqlite:///" if db_url.startswith("sqlite") else "postgresql+psycopg://")
        reg.migrate()
        ws = reg.ensure_workspace("via-env")
    with Registry(db_url) as direct:
        assert direct.list_workspaces() == [ws]
    assert not (tmp_path / "data" / "registry.sqlite").exists()


def test_for_data_dir_defaults_to_sqlite_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with Registry.for_data_dir(data_dir, env={}) as reg:
        assert reg.url == f"sqlite:///{data_dir / 'registry.sqlite'}"
        reg.migrate()
        reg.ensure_workspace("default")
    assert (data_dir / "registry.sqlite").is_file()


def test_postgres_url_rewrite() -> None:
    env = {"CRYOBOX_DATABASE_URL": "postgresql://cbx:secret@db.invalid:5433/cryobox"}
    assert url_for_data_dir(Path("/unused"), env) == "postgresql+psycopg://cbx:secret@db.invalid:5433/cryobox"
    assert normalize_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalize_url("postgresql+psycopg://u@h/d") == "postgresql+psycopg://u@h/d"
    with Registry.for_data_dir(Path("/unused"), env=env) as reg:  # no connection is made before first use
        assert reg.url == "postgresql+psycopg://cbx:***@db.invalid:5433/cryobox"
        assert reg.database.dialect == "postgresql"


def test_custom_template_rows_keep_owner_spec_and_error(registry: Registry) -> None:
    ws = registry.ensure_workspace("builders")
    spec = {"name": "t1", "packages": ["jq"], "files": {"/a": "b"}, "cpu": None, "nested": {"x": [1, 2]}}
    registry.upsert_template(
        TemplateRow(
            name="t1", generation="", cpus=1, memory_mib=512, status="building", path="", workspace_id=ws.id, spec=spec
        )
    )
    registry.update_template_status("t1", "error", "warm-up failed")
    row = registry.get_template("t1")
    assert (row.workspace_id, row.spec, row.status, row.error) == (ws.id, spec, "error", "warm-up failed")
    registry.delete_template("t1")
    registry.delete_template("t1")  # idempotent
    with pytest.raises(NotFound):
        registry.get_template("t1")
    with pytest.raises(NotFound):
        registry.update_template_status("t1", "ready")
