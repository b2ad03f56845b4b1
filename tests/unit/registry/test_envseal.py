"""Sandbox env sealed at rest in the registry (``registry/envseal.py``), on SQLite and a real PostgreSQL: no env
value in the database (column or file), every writer seals (add, update, fleet commit, moves), the wrong key or a
tampered value is ``secret_unreadable``, rows of older versions (plain mappings) read and get sealed, and the key
comes from ``CRYOBOX_SECRET_KEY`` or a key file beside the SQLite database."""

from __future__ import annotations

import json
import secrets
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from cryobox.errors import InvalidArgument, SecretUnreadable
from cryobox.registry import MoveRecords, Registry
from cryobox.registry.envseal import seal_plaintext
from cryobox.util.sealing import SECRET_KEY_ENV, Sealer, generate_key
from tests.support import registry as registry_support
from tests.support.registry import open_registry, sandbox

pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry

LEGACY_INSERT = (
    "INSERT INTO sandboxes (id, workspace_id, template, cpu, memory_mb, status, metadata, env, from_snapshot, "
    "boot_ms, boot_mode, host, created_at, persistent, ttl_seconds, expires_at, last_active_at, vm_id, guest_ip, "
    "instance_id) VALUES (:id, :ws, 't', 1, 512, 'running', '{}', :env, NULL, 1.0, 'restore', 'h1', 1.0, false, "
    "NULL, NULL, 1.0, NULL, NULL, NULL)"
)


def _secret() -> str:
    return f"s3cr3t-{secrets.token_hex(8)}"


def _stored_env(reg: Registry, sandbox_id: str) -> str:
    """The env column as the database holds it (its JSON text)."""
    with reg.database.engine.connect() as conn:
        value = conn.execute(text("SELECT CAST(env AS TEXT) FROM sandboxes WHERE id = :id"), {"id": sandbox_id})
        return str(value.scalar_one())


def _set_stored_env(reg: Registry, sandbox_id: str, json_text: str) -> None:
    with reg.database.engine.begin() as conn:
        conn.execute(text("UPDATE sandboxes SET env = :env WHERE id = :id"), {"env": json_text, "id": sandbox_id})


def test_every_writer_seals_and_every_reader_opens(registry: Registry) -> None:
    ws = registry.ensure_workspace("default").id
    secret = _secret()
    env = {"API_TOKEN": secret, "UNICODE": "日本 ✓"}
    row = sandbox("sb-1", ws, host="h1", status="running", env=env)
    registry.add_sandbox(row)
    stored = _stored_env(registry, "sb-1")
    assert stored.startswith('"') and secret not in stored and "API_TOKEN" not in stored
    assert registry.get_sandbox("sb-1") == row and registry.list_sandboxes() == [row]

    changed = {"API_TOKEN": _secret()}
    assert registry.update_sandbox("sb-1", env=changed).env == changed
    assert changed["API_TOKEN"] not in _stored_env(registry, "sb-1") and registry.get_sandbox("sb-1").env == changed

    registry.fleet.heartbeat("h2", url="http://h2.invalid", boot_id="b", capacity={}, info={}, now=100.0)
    held = registry.fleet.reserve(memory_mib=1, cpus=0, now=100.0, ttl_s=60.0, choose=lambda _: "h2", live_after=60.0)
    registry.fleet.commit(held.id, sandbox("sb-2", ws, host="h2", status="hibernated", env=env))
    assert secret not in _stored_env(registry, "sb-2") and registry.get_sandbox("sb-2").env == env

    moves = MoveRecords(registry.database, registry.sealer)
    assert moves.stored("sb-2", "h2", "g1")
    move = registry.fleet.reserve(memory_mib=1, cpus=0, now=101.0, ttl_s=60.0, choose=lambda _: "h2", live_after=60.0)
    moved = moves.move(move.id, "sb-2", from_host="h2", to_host="h2", changes={"status": "running", "env": changed})
    assert moved is not None and moved.env == changed and moved.status == "running"
    assert changed["API_TOKEN"] not in _stored_env(registry, "sb-2")


def test_the_sqlite_files_hold_no_env_value_and_the_key_file_is_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)
    secret, visible = _secret(), f"visible-{secrets.token_hex(8)}"
    db_dir = tmp_path / "db"
    with Registry(f"sqlite:///{db_dir / 'registry.sqlite'}") as reg:
        reg.migrate()
        ws = reg.ensure_workspace("default").id
        for i in range(3):
            reg.add_sandbox(sandbox(f"sb-{i}", ws, env={"TOKEN": secret}, metadata={"label": visible}))
        reg.update_sandbox("sb-0", status="running", env={"TOKEN": secret, "MORE": secret})
        assert reg.get_sandbox("sb-0").env == {"TOKEN": secret, "MORE": secret}
        files = sorted(db_dir.glob("registry.sqlite*"))  # the database, its WAL and shared memory
        blob = b"".join(p.read_bytes() for p in files)
        assert visible.encode() in blob, "the rows are in these files (the check below can see a value)"
        assert secret.encode() not in blob
    key_file = db_dir / "secrets" / "registry.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    blob = b"".join(p.read_bytes() for p in db_dir.glob("registry.sqlite*"))
    assert visible.encode() in blob and secret.encode() not in blob
    with Registry(f"sqlite:///{db_dir / 'registry.sqlite'}") as again:  # a restart: the same key file
        assert again.get_sandbox("sb-1").env == {"TOKEN": secret}


def test_a_wrong_key_is_secret_unreadable_never_an_empty_env(db_url: str) -> None:
    with open_registry(db_url) as reg:
        reg.migrate()
        ws = reg.ensure_workspace("default")
        reg.add_sandbox(sandbox("sb-1", ws.id, env={"TOKEN": _secret()}))
    with Registry(db_url, Sealer.from_keys(generate_key())) as other:
        assert other.list_workspaces() == [ws]  # what holds no secret still reads
        with pytest.raises(SecretUnreadable, match="sandbox sb-1") as info:
            other.get_sandbox("sb-1")
        assert info.value.code == "secret_unreadable" and info.value.http_status == 500
        with pytest.raises(SecretUnreadable):
            other.list_sandboxes()
        with pytest.raises(SecretUnreadable):
            other.update_sandbox("sb-1", status="stopped")


def test_a_tampered_env_is_secret_unreadable(registry: Registry) -> None:
    ws = registry.ensure_workspace("default").id
    registry.add_sandbox(sandbox("sb-1", ws, env={"TOKEN": _secret()}))
    token = _stored_env(registry, "sb-1").strip('"')
    tampered = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    _set_stored_env(registry, "sb-1", f'"{tampered}"')
    with pytest.raises(SecretUnreadable, match="tampered"):
        registry.get_sandbox("sb-1")
    _set_stored_env(registry, "sb-1", "42")  # neither a token nor a mapping
    with pytest.raises(SecretUnreadable):
        registry.get_sandbox("sb-1")


def test_plaintext_rows_of_older_versions_read_and_get_sealed(registry: Registry) -> None:
    ws = registry.ensure_workspace("default").id
    old, older = {"LEGACY": _secret()}, {"LEGACY": _secret(), "B": "2"}
    with registry.database.engine.begin() as conn:
        for sandbox_id, env in (("sb-old", old), ("sb-older", older)):
            conn.execute(text(LEGACY_INSERT), {"id": sandbox_id, "ws": ws, "env": json.dumps(env)})
    assert old["LEGACY"] in _stored_env(registry, "sb-old")
    assert registry.get_sandbox("sb-old").env == old and registry.get_sandbox("sb-older").env == older

    assert registry.update_sandbox("sb-old", status="paused").env == old  # the next write seals it
    assert old["LEGACY"] not in _stored_env(registry, "sb-old") and _stored_env(registry, "sb-old").startswith('"')
    assert older["LEGACY"] in _stored_env(registry, "sb-older")
    registry.migrate()  # at every start: what is still plaintext gets sealed
    assert older["LEGACY"] not in _stored_env(registry, "sb-older") and _stored_env(registry, "sb-older")[0] == '"'
    assert registry.get_sandbox("sb-old").env == old and registry.get_sandbox("sb-older").env == older
    with registry.database.engine.begin() as conn:
        conn.execute(text(LEGACY_INSERT), {"id": "sb-oldest", "ws": ws, "env": json.dumps(old)})
    assert seal_plaintext(registry.database, registry.sealer) == ["sb-oldest"]
    assert seal_plaintext(registry.database, registry.sealer) == []
    assert registry.get_sandbox("sb-oldest").env == old


def test_the_key_comes_from_the_env_var_or_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Registry.for_data_dir(data, env={}) as reg:
        reg.migrate()
        reg.add_sandbox(sandbox("sb-1", reg.ensure_workspace("default").id, env={"A": "1"}))
        assert reg.sealer.source == f"key file {data / 'secrets' / 'registry.key'}"
    assert (data / "secrets" / "registry.key").is_file()

    key = generate_key()
    other = tmp_path / "other"
    with Registry.for_data_dir(other, env={SECRET_KEY_ENV: key}) as reg:
        reg.migrate()
        reg.add_sandbox(sandbox("sb-1", reg.ensure_workspace("default").id, env={"A": "1"}))
        assert reg.sealer.source == SECRET_KEY_ENV
    assert not (other / "secrets").exists()
    with Registry(f"sqlite:///{other / 'registry.sqlite'}", Sealer.from_keys(key)) as same:
        assert same.get_sandbox("sb-1").env == {"A": "1"}
    with pytest.raises(InvalidArgument, match=SECRET_KEY_ENV):
        Registry.for_data_dir(other, env={SECRET_KEY_ENV: "not-a-key"})


def test_postgres_without_a_data_dir_needs_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)
    with Registry("postgresql://cbx@db.invalid/cryobox") as reg:  # no connection is made before first use
        with pytest.raises(InvalidArgument, match=SECRET_KEY_ENV):
            reg.sealer.seal({})
    with Registry("sqlite://") as memory:  # an in-memory database: a key as ephemeral as its rows
        memory.migrate()
        memory.add_sandbox(sandbox("sb-1", memory.ensure_workspace("default").id, env={"A": "1"}))
        assert memory.get_sandbox("sb-1").env == {"A": "1"}
