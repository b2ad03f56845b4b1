"""Quotas below the control plane: ``cryobox keys quota`` (in-process, typer's CliRunner, on a tmp data dir), the
registry revision 0006, the defaults from the environment and the guard's bookkeeping of admissions in flight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect
from typer.testing import CliRunner, Result

from cryobox.cli.main import app
from cryobox.errors import InvalidArgument, WorkspaceQuotaExceeded
from cryobox.registry import QuotaOverrides, QuotaRecords, Registry
from cryobox.server.control.quotas import Quota, QuotaGuard
from tests.support import registry as registry_support
from tests.support.registry import sandbox, snapshot

db_url = registry_support.db_url
pg_server = registry_support.pg_server
registry = registry_support.sqlite_registry


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CRYOBOX_DATABASE_URL", "CRYOBOX_QUOTA_SANDBOXES", "CRYOBOX_DEFAULT_TTL_S", "CRYOBOX_MAX_TTL_S"):
        monkeypatch.delenv(name, raising=False)


def keys(*args: str) -> Result:
    return CliRunner().invoke(app, ["keys", *args], env={"COLUMNS": "200"})


def quota_json(data_dir: Path, *args: str) -> dict[str, object]:
    result = keys("quota", "--data-dir", str(data_dir), "--json", *args)
    assert result.exit_code == 0, result.output
    body: dict[str, object] = json.loads(result.stdout)
    return body


# -- the CLI -----------------------------------------------------------------------------------------------------


def test_keys_quota_sets_shows_and_clears_a_workspace_limit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    missing = keys("quota", "--workspace", "team", "--data-dir", str(data))
    assert missing.exit_code == 2 and "not found" in missing.output
    body = quota_json(data, "--workspace", "team", "--sandboxes", "5", "--memory-mib", "2048")
    assert body["workspace"] == "team" and body["overrides"] == {"sandboxes": 5, "memory_mib": 2048}
    limits = body["limits"]
    assert isinstance(limits, dict) and (limits["sandboxes"], limits["memory_mib"], limits["vcpus"]) == (5, 2048, 64)
    assert body["usage"] == {
        "sandboxes": 0,
        "vcpus": 0,
        "memory_mib": 0,
        "snapshot_bytes": 0,
        "templates": 0,
        "hibernated": 0,
        "volumes": 0,
        "volume_bytes": 0,
    }
    body = quota_json(data, "--workspace", "team", "--templates", "2")  # the others keep theirs
    assert body["overrides"] == {"sandboxes": 5, "memory_mib": 2048, "templates": 2}
    assert quota_json(data, "--workspace", "team")["overrides"] == body["overrides"]  # shown, unchanged
    shown = keys("quota", "--workspace", "team", "--data-dir", str(data))
    assert shown.exit_code == 0 and "sandboxes" in shown.stdout and "workspace" in shown.stdout
    with Registry.for_data_dir(data) as reg:  # what the server's guard reads
        ws = next(w for w in reg.list_workspaces() if w.name == "team")
        assert QuotaRecords(reg.database).get(ws.id) == QuotaOverrides(sandboxes=5, memory_mib=2048, templates=2)
    body = quota_json(data, "--workspace", "team", "--clear", "--vcpus", "3")
    assert body["overrides"] == {"vcpus": 3}
    body = quota_json(data, "--workspace", "team", "--clear")
    assert body["overrides"] == {} and body["limits"] == {**Quota().limits()}
    bad = keys("quota", "--workspace", "team", "--data-dir", str(data), "--max-ttl-s", "0")
    assert bad.exit_code == 2  # refused by the option itself


async def test_a_limit_set_with_the_cli_is_what_the_guard_enforces(tmp_path: Path) -> None:
    data = tmp_path / "data"
    quota_json(data, "--workspace", "default", "--sandboxes", "1")
    with Registry.for_data_dir(data) as reg:
        reg.migrate()
        ws = reg.ensure_workspace("default").id
        guard = QuotaGuard(QuotaRecords(reg.database), Quota())
        with await guard.admit(ws, 1, 512):
            with pytest.raises(WorkspaceQuotaExceeded) as info:
                await guard.admit(ws, 1, 512)
        assert info.value.details == {"resource": "sandboxes", "limit": 1, "used": 1, "requested": 1}
        quota_json(data, "--workspace", "default", "--clear")
        (await guard.admit(ws, 1, 512, 2)).release()


# -- revision 0006 -----------------------------------------------------------------------------------------------


def test_0006_adds_workspace_quotas_to_an_existing_registry(db_url: str) -> None:
    with Registry(db_url) as reg:
        db = reg.database
        cfg = db._alembic_config()
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0005")
        ws = reg.ensure_workspace("old").id
        reg.migrate()
        assert db.current_revision() == db.head_revision()  # 0006 and every later revision
        records = QuotaRecords(db)
        assert records.get(ws) == QuotaOverrides()  # no row: every limit is the server default
        assert records.set(ws, snapshot_bytes=5 << 40, default_ttl_s=0) == QuotaOverrides(
            snapshot_bytes=5 << 40, default_ttl_s=0
        )
        with pytest.raises(InvalidArgument):
            records.set(ws, sandboxes=-1)
        with pytest.raises(InvalidArgument):
            records.set(ws, bogus=1)
        with db.engine.begin() as conn:  # the downgrade works too, and the upgrade again after it
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0005")
        assert "workspace_quotas" not in inspect(db.engine).get_table_names()
        reg.migrate()
        assert records.get(ws) == QuotaOverrides()


# -- defaults and bookkeeping ------------------------------------------------------------------------------------


def test_defaults_come_from_the_environment() -> None:
    assert Quota.from_env({}) == Quota()
    assert Quota().default_ttl_s is None  # creates without a TTL never expire unless configured
    env = {
        "CRYOBOX_QUOTA_SANDBOXES": "7",
        "CRYOBOX_QUOTA_VCPUS": "8",
        "CRYOBOX_QUOTA_MEMORY_MIB": "4096",
        "CRYOBOX_QUOTA_SNAPSHOT_BYTES": str(1 << 30),
        "CRYOBOX_QUOTA_TEMPLATES": "0",
        "CRYOBOX_DEFAULT_TTL_S": "60",
        "CRYOBOX_MAX_TTL_S": "120",
    }
    assert Quota.from_env(env) == Quota(7, 8, 4096, 1 << 30, 0, 60, 120)
    assert Quota.from_env({"CRYOBOX_DEFAULT_TTL_S": "0"}).default_ttl_s is None
    for bad in ({"CRYOBOX_QUOTA_VCPUS": "many"}, {"CRYOBOX_QUOTA_VCPUS": "-1"}, {"CRYOBOX_MAX_TTL_S": "0"}):
        with pytest.raises(InvalidArgument):
            Quota.from_env(bad)
    merged = Quota().with_overrides(QuotaOverrides(vcpus=2, default_ttl_s=0, max_ttl_s=30))
    assert (merged.vcpus, merged.default_ttl_s, merged.max_ttl_s, merged.sandboxes) == (2, None, 30, 50)


async def test_rows_written_while_admitted_are_not_counted_twice(registry: Registry) -> None:
    ws = registry.ensure_workspace("w").id
    guard = QuotaGuard(QuotaRecords(registry.database), Quota(sandboxes=2, vcpus=2))
    admission = await guard.admit(ws, 1, 512, 2, sandbox_ids=["sb-1", "sb-2"])
    registry.add_sandbox(sandbox("sb-1", ws, status="running"))  # one of them committed, the admission still held
    _, used = await guard.status(ws)
    assert (used.sandboxes, used.vcpus, used.memory_mib) == (2, 2, 1024)
    with pytest.raises(WorkspaceQuotaExceeded):
        await guard.admit(ws, 1, 512)
    admission.release()
    admission.release()  # idempotent
    _, used = await guard.status(ws)
    assert (used.sandboxes, used.vcpus) == (1, 1)
    # a hibernated row counts against `hibernated`, not `sandboxes`; a wake makes it a sandbox again
    registry.add_sandbox(sandbox("sb-h", ws, status="hibernated"))
    _, used = await guard.status(ws)
    assert (used.sandboxes, used.vcpus, used.hibernated) == (1, 1, 1)
    with await guard.admit(ws, 1, 512, sandbox_ids=["sb-h"]):
        _, used = await guard.status(ws)
        assert (used.sandboxes, used.vcpus) == (2, 2)
        with pytest.raises(WorkspaceQuotaExceeded) as info:
            await guard.admit(ws, 1, 512, sandbox_ids=["sb-x"])
        assert info.value.details["resource"] == "sandboxes"
    registry.add_sandbox(sandbox("sb-lost", ws, status="lost"))  # lost and stopped rows hold nothing
    registry.add_snapshot(snapshot("snap-1", ws, size_bytes=3000))
    _, used = await guard.status(ws)
    assert (used.sandboxes, used.vcpus, used.snapshot_bytes, used.hibernated) == (1, 1, 3000, 1)


async def test_hibernations_are_admitted_within_the_hibernated_quota(registry: Registry) -> None:
    ws = registry.ensure_workspace("w").id
    guard = QuotaGuard(QuotaRecords(registry.database), Quota(sandboxes=10, hibernated=2))
    registry.add_sandbox(sandbox("sb-h1", ws, status="hibernated"))
    for name in ("sb-r1", "sb-r2"):
        registry.add_sandbox(sandbox(name, ws, status="running"))
    first = await guard.admit_hibernation(ws, "sb-r1")  # 1 hibernated + 1 in flight: full
    with pytest.raises(WorkspaceQuotaExceeded) as info:
        await guard.admit_hibernation(ws, "sb-r2")
    assert info.value.details == {"resource": "hibernated", "limit": 2, "used": 2, "requested": 1}
    again = await guard.admit_hibernation(ws, "sb-h1")  # hibernated already: takes nothing new
    again.release()
    registry.update_sandbox("sb-r1", status="hibernated")  # the row says so while the admission is still held
    _, used = await guard.status(ws)
    assert used.hibernated == 2  # counted once
    first.release()
    registry.update_sandbox("sb-h1", status="running")  # woken: room for one more
    with await guard.admit_hibernation(ws, "sb-r2"):
        _, used = await guard.status(ws)
        assert (used.hibernated, used.sandboxes) == (2, 2)
