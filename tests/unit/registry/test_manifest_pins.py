"""Revision 0007: snapshots gain ``manifest_sha256``, sandboxes ``hibernation_manifest_sha256`` (SQLite and
PostgreSQL); rows from before keep NULL (unpinned); the hibernation pin is set with ``stored`` and cleared whenever
the stored image stops being the sandbox (a local hibernation, a move, a reconcile)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from cryobox.registry import MoveRecords, Registry
from tests.support import registry as registry_support
from tests.support.registry import open_registry, sandbox

registry = registry_support.registry
db_url = registry_support.db_url
pg_server = registry_support.pg_server
SHA = "ab" * 32


def _columns(reg: Registry, table: str) -> set[str]:
    return {c["name"] for c in inspect(reg.database.engine).get_columns(table)}


def test_0007_adds_the_manifest_pins_and_leaves_existing_rows_unpinned(db_url: str) -> None:
    with open_registry(db_url) as reg:
        db = reg.database
        cfg = db._alembic_config()
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0006")
        assert "manifest_sha256" not in _columns(reg, "snapshots")
        assert "hibernation_manifest_sha256" not in _columns(reg, "sandboxes")
        ws = reg.ensure_workspace("old")
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO snapshots (id, workspace_id, sandbox_id, template, parent_id, path, size_bytes, "
                    "pause_ms, labels, retain, created_at, orphaned_at, host, location, generation) VALUES "
                    "('snap-old', :ws, NULL, 't', NULL, '/p', 1, NULL, '{}', false, 1.0, NULL, 'h', 'stored', 'g1')"
                ),
                {"ws": ws.id},
            )
            conn.execute(
                text(
                    "INSERT INTO sandboxes (id, workspace_id, template, cpu, memory_mb, status, metadata, env, "
                    "from_snapshot, boot_ms, boot_mode, host, created_at, persistent, ttl_seconds, expires_at, "
                    "last_active_at, vm_id, guest_ip, instance_id, hibernation, hibernation_generation, egress) "
                    "VALUES ('sb-old', :ws, 't', 1, 512, 'hibernated', '{}', '{}', NULL, 1.0, 'restore', 'h', 1.0, "
                    "false, NULL, NULL, 1.0, NULL, NULL, NULL, 'stored', 'g1', NULL)"
                ),
                {"ws": ws.id},
            )
        reg.migrate()
        assert db.current_revision() == db.head_revision()  # 0007 and every later revision
        assert reg.get_snapshot("snap-old").manifest_sha256 is None  # stored before pinning: trusted as fetched
        assert reg.get_sandbox("sb-old").hibernation_manifest_sha256 is None
        assert reg.update_snapshot("snap-old", manifest_sha256=SHA).manifest_sha256 == SHA
        assert reg.get_snapshot("snap-old").manifest_sha256 == SHA
        assert reg.update_sandbox("sb-old", hibernation_manifest_sha256=SHA) == reg.get_sandbox("sb-old")
        assert reg.get_sandbox("sb-old").hibernation_manifest_sha256 == SHA
        with db.engine.begin() as conn:  # the downgrade works too, and the upgrade again after it
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0006")
        assert "manifest_sha256" not in _columns(reg, "snapshots")
        assert "hibernation_manifest_sha256" not in _columns(reg, "sandboxes")
        with db.engine.connect() as conn:  # the rest of the row survived
            assert conn.execute(text("SELECT location FROM snapshots WHERE id = 'snap-old'")).scalar() == "stored"
        reg.migrate()
        assert reg.get_snapshot("snap-old").manifest_sha256 is None


def test_the_hibernation_pin_lives_exactly_as_long_as_the_stored_image(registry: Registry) -> None:
    ws = registry.ensure_workspace("default").id
    moves = MoveRecords(registry.database, registry.sealer)
    registry.add_sandbox(sandbox("sb-1", ws, host="a", status="running"))
    assert moves.hibernated("sb-1", "a", None)
    assert moves.stored("sb-1", "a", "g1", SHA)
    row = registry.get_sandbox("sb-1")
    assert (row.hibernation, row.hibernation_generation, row.hibernation_manifest_sha256) == ("stored", "g1", SHA)

    assert moves.hibernated("sb-1", "a", None)  # hibernated again there: the stored image is not this one
    assert registry.get_sandbox("sb-1").hibernation_manifest_sha256 is None
    assert moves.stored("sb-1", "a", "g1", SHA)
    moved = moves.move("no-such-reservation", "sb-1", from_host="a", to_host="b", changes={"status": "running"})
    assert moved is not None and (moved.host, moved.hibernation, moved.hibernation_manifest_sha256) == ("b", None, None)

    registry.add_sandbox(sandbox("sb-2", ws, host="b", status="hibernated", hibernation="stored"))
    registry.update_sandbox("sb-2", hibernation_manifest_sha256=SHA)
    registry.fleet.reconcile_host("b", {"sb-1": "running", "sb-2": "running"})  # woken there: no longer stored
    assert registry.get_sandbox("sb-2").hibernation_manifest_sha256 is None
